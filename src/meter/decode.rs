//! Meter stage: a compressed reply decoded for metering only. The gateway asks upstreams for
//! `identity`; one that compresses anyway (`gzip`, `deflate`, `br`, `zstd`) has its reply
//! passed on as it came, and a copy decoded here, piece by piece, for the meter.

use std::io::Write;

/// A streaming decoder of one reply's content coding.
pub enum Decoder {
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Deflate(flate2::write::ZlibDecoder<Vec<u8>>),
    Brotli(Box<brotli::DecompressorWriter<Vec<u8>>>),
    Zstd(Box<zstd::stream::write::Decoder<'static, Vec<u8>>>),
    /// The coding could not be decoded (bad data): metering goes on without it.
    Failed,
}

/// A decoded reply past this is not decoded further (what was decoded is metered).
const DECODED_MAX: usize = 64 * 1024 * 1024;

impl Decoder {
    /// The decoder for a `Content-Encoding` value, if it is one the gateway decodes (one
    /// coding; `identity` needs none).
    pub fn for_coding(coding: &str) -> Option<Decoder> {
        let coding = coding.trim();
        Some(
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                Decoder::Gzip(flate2::write::GzDecoder::new(Vec::new()))
            } else if coding.eq_ignore_ascii_case("deflate") {
                Decoder::Deflate(flate2::write::ZlibDecoder::new(Vec::new()))
            } else if coding.eq_ignore_ascii_case("br") {
                Decoder::Brotli(Box::new(brotli::DecompressorWriter::new(Vec::new(), 4096)))
            } else if coding.eq_ignore_ascii_case("zstd") {
                Decoder::Zstd(Box::new(
                    zstd::stream::write::Decoder::new(Vec::new()).ok()?,
                ))
            } else {
                return None;
            },
        )
    }

    /// The content of `piece` as far as it can be decoded now.
    pub fn decode(&mut self, piece: &[u8]) -> Vec<u8> {
        let out = match self {
            Decoder::Gzip(d) => d
                .write_all(piece)
                .and_then(|()| d.flush())
                .map(|()| d.get_mut()),
            Decoder::Deflate(d) => d
                .write_all(piece)
                .and_then(|()| d.flush())
                .map(|()| d.get_mut()),
            Decoder::Brotli(d) => d
                .write_all(piece)
                .and_then(|()| d.flush())
                .map(|()| d.get_mut()),
            Decoder::Zstd(d) => d
                .write_all(piece)
                .and_then(|()| d.flush())
                .map(|()| d.get_mut()),
            Decoder::Failed => return Vec::new(),
        };
        match out {
            Ok(buf) if buf.len() <= DECODED_MAX => std::mem::take(buf),
            _ => {
                *self = Decoder::Failed;
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_pieces(mut d: Decoder, coded: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in coded.chunks(7) {
            out.extend(d.decode(piece));
        }
        out
    }

    /// Each coding decodes, fed in pieces as a reply comes; bad data stops decoding quietly.
    #[test]
    fn every_coding_decodes_in_pieces() {
        let text = br#"{"id":"x","usage":{"prompt_tokens":4,"completion_tokens":8}}"#.repeat(50);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&text).expect("gzip");
        let mut zl = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        zl.write_all(&text).expect("deflate");
        let mut br = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut br, 4096, 5, 22);
            w.write_all(&text).expect("br");
        }
        let zs = zstd::encode_all(&text[..], 3).expect("zstd");
        for (coding, coded) in [
            ("gzip", gz.finish().expect("gzip")),
            ("deflate", zl.finish().expect("deflate")),
            ("br", br),
            ("zstd", zs),
        ] {
            let d = Decoder::for_coding(coding).expect(coding);
            assert_eq!(in_pieces(d, &coded), text, "{coding}");
        }
        assert!(Decoder::for_coding("identity").is_none());
        assert!(Decoder::for_coding("gzip, br").is_none());
        let mut bad = Decoder::for_coding("gzip").expect("gzip");
        assert!(bad.decode(b"not gzip at all, not at all").is_empty());
        assert!(matches!(bad, Decoder::Failed));
    }
}
