fn main() -> std::process::ExitCode {
    modelgate::cli::run()
}
