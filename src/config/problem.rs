//! A config problem names file, line and field. Loading collects them all.

use std::fmt;
use std::ops::Range;

#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub file: String,
    pub line: Option<usize>,
    pub field: String,
    pub message: String,
}

impl Problem {
    pub fn new(file: &str, line: Option<usize>, field: &str, message: impl Into<String>) -> Self {
        Problem {
            file: file.to_string(),
            line,
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// A parse or type error from the toml crate, which carries a byte span.
    pub fn from_toml(file: &str, text: &str, e: &toml::de::Error) -> Self {
        let line = e.span().map(|s| line_of(text, s.start));
        // toml's message is the last line of its Display; the span gives the place.
        let named = e
            .message()
            .split('`')
            .nth(1)
            .filter(|_| e.message().contains("field"));
        // A type error names no field: take the key written on the line the span points at.
        let field = named
            .map(str::to_string)
            .or_else(|| e.span().and_then(|s| key_at(text, s.start)))
            .unwrap_or_default();
        let mut message = e.message().trim().replace(
            "data did not match any variant of untagged enum RawUpstream",
            "an upstream is a URL string or a table { url, weight, api_key }",
        );
        // A file cut short (`secret = ` and nothing after) leaves toml with no words of its own.
        if message.is_empty() {
            message = "is not valid TOML here: a value is missing or cut short".into();
        }
        Problem::new(file, line, &field, message)
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn one(p: Problem) -> Self {
        Problems(vec![p])
    }
    pub fn push(&mut self, p: Problem) {
        self.0.push(p);
    }
    pub fn extend(&mut self, other: Problems) {
        self.0.extend(other.0);
    }
    /// Drops the problems after the first `named` about a field one of those names, on its
    /// line: a value left out for its shape is not named again by the checks that follow.
    pub fn after_shape(mut self, named: usize) -> Problems {
        let shape: Vec<Problem> = self.0[..named.min(self.0.len())].to_vec();
        let leaf = |f: &str| f.rsplit('.').next().unwrap_or(f).to_string();
        let mut i = 0;
        self.0.retain(|p| {
            i += 1;
            i <= named
                || !shape.iter().any(|s| {
                    s.file == p.file && s.line == p.line && leaf(&s.field) == leaf(&p.field)
                })
        });
        self
    }
    pub fn into_result<T>(self, value: T) -> Result<T, Problems> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// 1-based line of a byte offset.
/// The key of a `key = value` line holding `offset` (a dotted or quoted key as written).
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let (key, _) = text.get(start..end)?.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.starts_with('[') && !key.starts_with('#')).then(|| key.to_string())
}

pub fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Deserializes a TOML file as far as it goes, naming every problem of shape rather than the
/// first: an unknown field or a value of the wrong type is reported, blanked out of the text
/// (spaces over the entry, so every later offset and line stays where it was) and the rest
/// deserialized again. A syntax error, a missing field or a problem in no single entry (an
/// unknown table, say) ends the search. The value is there when what remains deserializes;
/// it is built from the blanked text, whose offsets are the original's.
pub fn deserialize_all<T: serde::de::DeserializeOwned>(
    file: &str,
    text: &str,
) -> (Option<T>, Problems) {
    // Each round parses the file again: a keys file of 100,000 entries takes a fraction of a
    // second a round, and the hot reload runs this too.
    deserialize_within(file, text, 100, std::time::Duration::from_secs(1))
}

/// `deserialize_all` within `max_rounds` rounds and `search_time`: past either the search
/// stops, saying so; the first problem is always named.
fn deserialize_within<T: serde::de::DeserializeOwned>(
    file: &str,
    text: &str,
    max_rounds: usize,
    search_time: std::time::Duration,
) -> (Option<T>, Problems) {
    let started = std::time::Instant::now();
    let mut problems = Problems::default();
    // Copied only once a round has something to blank: a sound file is parsed as it is.
    let mut blanked = std::borrow::Cow::Borrowed(text);
    // The entries blanked so far (key, where, a stand-in of the type serde expected): a field
    // found missing after that is no news, and a stand-in lets the search go on past it.
    let mut gone: Vec<(String, Range<usize>, Option<&'static str>)> = Vec::new();
    for round in 0.. {
        if round == max_rounds || (round > 0 && started.elapsed() > search_time) {
            problems.push(Problem::new(
                file,
                None,
                "",
                format!("(the search stopped after {round} problems; fix these and check again)"),
            ));
            break;
        }
        let e = match toml::from_str::<T>(&blanked) {
            Ok(v) => return (Some(v), problems),
            Err(e) => e,
        };
        let problem = Problem::from_toml(file, &blanked, &e);
        // A missing field is not in the text to be blanked: the search ends there, unless it
        // is one blanked for its type (no news): a stand-in of the right type then takes its
        // place (on its line: the checks' follow-on problems about it are dropped, see
        // `after_shape`) and the search goes on.
        if e.message().starts_with("missing field") {
            let stand_in = gone
                .iter()
                .position(|(k, _, s)| *k == problem.field && s.is_some())
                .map(|i| gone.swap_remove(i));
            match stand_in {
                // Written over the start of the blanked entry, which holds it (see where it
                // is chosen): every offset and line stays where it was.
                Some((key, range, Some(value))) => {
                    let text = format!("{key}={value}");
                    let at = range.start..range.start + text.len();
                    blanked.to_mut().replace_range(at, &text);
                    continue;
                }
                _ if gone.iter().any(|(k, _, _)| *k == problem.field) => {}
                _ => problems.push(problem),
            }
            break;
        }
        problems.push(problem);
        // serde refuses a list of an untagged enum as a whole, naming no element.
        let whole_list = e.message().contains("did not match any variant");
        let entry = e.span().and_then(|span| {
            let doc = toml_edit::ImDocument::parse(&*blanked).ok()?;
            entry_at(&blanked, doc.as_table(), &span, whole_list)
        });
        let Some((mut range, in_list)) = entry else {
            break;
        };
        let key = leaf_key(&blanked, range.start);
        let dotted = dotted_start(&blanked, range.start);
        // A stand-in goes only where a plain `key = value` was (not in a list, not dotted).
        let plain = !in_list && dotted == range.start;
        range.start = dotted;
        if let Some(key) = key {
            // Only a stand-in that fits on the entry's first line, so nothing moves.
            let room = blanked[range.clone()].find('\n').unwrap_or(range.len());
            let stand_in = plain
                .then(|| stand_in(e.message()))
                .flatten()
                .filter(|v| key.len() + 1 + v.len() <= room);
            gone.push((key, range.clone(), stand_in));
        }
        blank(blanked.to_mut(), range, in_list);
    }
    (None, problems)
}

/// The byte range of the innermost entry (`key = value`, or an array element) holding
/// `span`, and whether it sits in an inline list (an inline table or an array), where a
/// comma goes with it.
fn entry_at(
    text: &str,
    table: &toml_edit::Table,
    span: &Range<usize>,
    whole_list: bool,
) -> Option<(Range<usize>, bool)> {
    for (k, item) in table.iter() {
        if let Some(t) = item.as_table() {
            if let Some(found) = entry_at(text, t, span, whole_list) {
                return Some(found);
            }
            // `a.b = 1` refused at `a` (a table where a value goes): its entries go, one a
            // round.
            let at_key = table.key(k).and_then(|k| k.span());
            if t.is_dotted() && at_key.is_some_and(|ks| contains(&ks, span)) {
                return first_leaf(&entries_of(t));
            }
            continue;
        }
        if let Some(tables) = item.as_array_of_tables() {
            if let Some(found) = tables
                .iter()
                .find_map(|t| entry_at(text, t, span, whole_list))
            {
                return Some(found);
            }
            continue;
        }
        let (Some(ks), Some(value)) = (table.key(k).and_then(|k| k.span()), item.as_value()) else {
            continue;
        };
        if let Some(found) = in_value(value, span) {
            return Some(found);
        }
        let vs = value.span()?;
        // A list whose element serde refused without naming it (an untagged enum): the
        // elements go, the key stays (an empty list is then the checks' to name).
        if whole_list && value.is_array() && vs == *span && vs.len() > 2 {
            let inner = vs.start + 1..vs.end - 1;
            if !text_is_blank(text, &inner) {
                return Some((inner, false));
            }
        }
        let whole = ks.start..vs.end;
        if contains(&whole, span) {
            return Some((whole, false));
        }
    }
    None
}

/// One entry of a table: its key, and its value or the table it opens.
type Entry<'a> = (
    Option<&'a toml_edit::Key>,
    Option<&'a toml_edit::Value>,
    Option<&'a toml_edit::Table>,
);

fn entries_of(t: &toml_edit::Table) -> Vec<Entry<'_>> {
    t.iter()
        .map(|(k, i)| (t.key(k), i.as_value(), i.as_table()))
        .collect()
}

fn entries_of_inline(t: &toml_edit::InlineTable) -> Vec<Entry<'_>> {
    t.iter().map(|(k, v)| (t.key(k), Some(v), None)).collect()
}

/// The first `key = value` of a dotted table (its last key to its value), looking into the
/// dotted tables inside it.
fn first_leaf(entries: &[Entry<'_>]) -> Option<(Range<usize>, bool)> {
    for &(key, value, table) in entries {
        if let Some(found) = table.and_then(|t| first_leaf(&entries_of(t))) {
            return Some(found);
        }
        let (Some(ks), Some(v)) = (key.and_then(|k| k.span()), value) else {
            continue;
        };
        match v {
            toml_edit::Value::InlineTable(t) if t.is_dotted() => {
                if let Some(found) = first_leaf(&entries_of_inline(t)) {
                    return Some(found);
                }
            }
            _ => return Some((ks.start..v.span()?.end, false)),
        }
    }
    None
}

/// Inside a value: the entry of an inline table or the element of an array holding `span`.
fn in_value(value: &toml_edit::Value, span: &Range<usize>) -> Option<(Range<usize>, bool)> {
    match value {
        toml_edit::Value::InlineTable(t) => t.iter().find_map(|(k, v)| {
            if let Some(found) = in_value(v, span) {
                return Some(found);
            }
            // `{ a.b = 1 }` refused at `a`: its first entry goes (in the list, with a comma).
            if let toml_edit::Value::InlineTable(dotted) = v {
                let at_key = t.key(k).and_then(|k| k.span());
                if dotted.is_dotted() && at_key.is_some_and(|ks| contains(&ks, span)) {
                    return first_leaf(&entries_of_inline(dotted)).map(|(r, _)| (r, true));
                }
            }
            let whole = t.key(k)?.span()?.start..v.span()?.end;
            contains(&whole, span).then_some((whole, true))
        }),
        toml_edit::Value::Array(a) => a.iter().find_map(|v| {
            if let Some(found) = in_value(v, span) {
                return Some(found);
            }
            let whole = v.span()?;
            contains(&whole, span).then_some((whole, true))
        }),
        _ => None,
    }
}

/// A value of the type a serde "invalid type" message expected, if it names a simple one.
fn stand_in(message: &str) -> Option<&'static str> {
    let expected = message.split(", expected ").nth(1)?.trim();
    let integer = [
        "u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize",
    ];
    Some(match expected {
        "a string" => "\"\"",
        "a boolean" => "false",
        "a sequence" => "[]",
        "f32" | "f64" | "a float" => "0.0",
        e if integer.contains(&e) || e == "an integer" => "0",
        e if e == "a map" || e.starts_with("struct ") => "{}",
        _ => return None,
    })
}

/// The bare key an entry starting at `start` sets (`name` of `name = …`), if it is one.
fn leaf_key(text: &str, start: usize) -> Option<String> {
    let (key, _) = text.get(start..)?.split_once('=')?;
    let key = key.trim();
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    bare.then(|| key.to_string())
}

/// Where the entry whose last key starts at `start` begins: before its dotted prefix (`a.b`
/// of `a.b.c = 1`), which the parser spans apart from the last key. Blanking only from the
/// last key would leave `a.b.` behind, and the next round a syntax error.
fn dotted_start(text: &str, start: usize) -> usize {
    let head = &text.as_bytes()[..start];
    let key_byte = |b: u8| b.is_ascii_alphanumeric() || b"_-.\"' \t".contains(&b);
    let from = head
        .iter()
        .rposition(|&b| !key_byte(b))
        .map_or(0, |i| i + 1);
    let prefix = &head[from..];
    if !prefix.contains(&b'.') {
        return start;
    }
    from + prefix
        .iter()
        .take_while(|b| b.is_ascii_whitespace())
        .count()
}

fn text_is_blank(text: &str, r: &Range<usize>) -> bool {
    text.get(r.clone())
        .is_none_or(|t| t.bytes().all(|b| b.is_ascii_whitespace()))
}

fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

/// Spaces over `range` (newlines kept); in an inline list, over one neighbouring comma too.
fn blank(text: &mut String, range: Range<usize>, in_list: bool) {
    let mut bytes = std::mem::take(text).into_bytes();
    let mut comma = None;
    if in_list {
        let after = bytes[range.end..]
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .map(|i| range.end + i);
        let before = bytes[..range.start]
            .iter()
            .rposition(|b| !b.is_ascii_whitespace());
        comma = [after, before]
            .into_iter()
            .flatten()
            .find(|&i| bytes[i] == b',');
    }
    for b in &mut bytes[range] {
        if *b != b'\n' {
            *b = b' ';
        }
    }
    if let Some(i) = comma {
        bytes[i] = b' ';
    }
    // Each byte of a character inside the range became a space, and a range starts and ends
    // on character boundaries (the parser's spans): still UTF-8.
    *text = String::from_utf8(bytes).unwrap_or_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        name: String,
        #[serde(default)]
        n: Option<u32>,
        #[serde(default)]
        list: Vec<u32>,
        #[serde(default)]
        items: Vec<Item>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        a: u32,
        #[serde(default)]
        b: Option<u32>,
    }

    #[test]
    fn every_unknown_field_and_wrong_type_is_named_at_its_line() {
        let text = "name = \"x\"\nnmae = 1\nn = \"two\"\nlist = [1, \"z\", 3]\n\
            [[items]]\na = 1\nc = { d = 2, e = 3 }\n[[items]]\na = 2\nb = [1]\n";
        let (doc, p) = deserialize_all::<Doc>("f.toml", text);
        let found: Vec<(Option<usize>, &str)> =
            p.0.iter().map(|p| (p.line, p.field.as_str())).collect();
        assert_eq!(
            found,
            [
                (Some(2), "nmae"),
                (Some(3), "n"),
                (Some(4), "list"),
                (Some(7), "c"),
                (Some(10), "b"),
            ],
            "{p}"
        );
        let doc = doc.expect("what remains deserializes");
        assert_eq!((doc.list, doc.items.len()), (vec![1, 3], 2));
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Two {
        name: String,
        pool: String,
        #[serde(default)]
        n: Option<u32>,
    }

    /// Required fields of the wrong type get stand-ins where they fit (the search goes on,
    /// every line stays); where one does not fit, the search ends there as for a missing field.
    #[test]
    fn required_fields_of_the_wrong_type_get_stand_ins_that_move_nothing() {
        let text = "name = 12345\npool = 1\nn = \"x\"\nq = 1\n";
        let (doc, p) = deserialize_all::<Two>("f.toml", text);
        let found: Vec<(Option<usize>, &str)> =
            p.0.iter().map(|p| (p.line, p.field.as_str())).collect();
        assert_eq!(
            found,
            [
                (Some(1), "name"),
                (Some(2), "pool"),
                (Some(3), "n"),
                (Some(4), "q")
            ],
            "{p}"
        );
        assert!(doc.is_some(), "{p}");
        // `name=1` has no room for `name=""`.
        let (doc, p) = deserialize_all::<Two>("f.toml", "name=1\npool=2\n");
        assert!(doc.is_none());
        let found: Vec<&str> = p.0.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(found, ["name", "pool"], "{p}");
    }

    #[test]
    fn the_search_stops_at_its_limits_and_says_so() {
        let text: String = std::iter::once("name = \"x\"\n".to_string())
            .chain((0..10).map(|i| format!("extra{i} = {i}\n")))
            .collect();
        let minute = std::time::Duration::from_secs(60);
        let (doc, p) = deserialize_within::<Doc>("f.toml", &text, 5, minute);
        assert!(doc.is_none());
        assert_eq!(p.0.len(), 6, "{p}");
        assert_eq!((p.0[4].line, p.0[4].field.as_str()), (Some(6), "extra4"));
        assert!(p.0[5].message.contains("stopped after 5"), "{p}");
        // Out of time: the first problem is named all the same.
        let (_, p) = deserialize_within::<Doc>("f.toml", &text, 5, std::time::Duration::ZERO);
        assert_eq!(p.0.len(), 2, "{p}");
        assert_eq!(p.0[0].field, "extra0");
    }

    #[test]
    fn a_syntax_error_or_a_missing_field_ends_the_search() {
        let (doc, p) = deserialize_all::<Doc>("f.toml", "name = \"x\"\nn = \n");
        assert!(doc.is_none());
        assert_eq!(p.0.len(), 1);
        let (doc, p) = deserialize_all::<Doc>("f.toml", "nmae = \"x\"\n");
        assert!(doc.is_none());
        assert_eq!(p.0.len(), 2, "{p}");
        assert!(p.0[1].message.contains("missing field"), "{p}");
    }

    #[test]
    fn a_dotted_entry_goes_whole() {
        let text = "name = \"x\"\nitems = [{ a = 1, b.c = 2 }]\nn.m = 3\n";
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Loose {
            name: String,
            #[serde(default)]
            n: Option<u32>,
            #[serde(default)]
            items: Vec<Item>,
        }
        let (doc, p) = deserialize_all::<Loose>("f.toml", text);
        let found: Vec<(Option<usize>, &str)> =
            p.0.iter().map(|p| (p.line, p.field.as_str())).collect();
        // `b.c` is no field of an item, `n.m` makes `n` a table: each named once, and
        // what remains (no syntax error left behind) deserializes.
        assert_eq!(found.len(), 2, "{p}");
        assert_eq!((found[0].0, found[1].0), (Some(2), Some(3)), "{p}");
        assert!(doc.is_some(), "{p}");
        assert_eq!(dotted_start("x = { a.b = 1 }", 8), 6);
        assert_eq!(dotted_start("k = 1\nserver . workers = 2", 15), 6);
        assert_eq!(dotted_start("k = 1\nworkers = 2", 6), 6);
    }

    #[test]
    fn an_inline_entry_goes_with_its_comma() {
        let mut t = "x = { a = 1, b = 2 }".to_string();
        blank(&mut t, 6..11, true);
        assert_eq!(t, format!("x = {{{}b = 2 }}", " ".repeat(8)));
        let mut t = "x = [1, 2]".to_string();
        blank(&mut t, 8..9, true);
        assert_eq!(t, "x = [1   ]");
    }

    #[test]
    fn a_file_cut_short_gets_words() {
        let text = "[[keys]]\nid = \"a\"\nsecret = ";
        let e = toml::from_str::<toml::Table>(text).expect_err("cut short");
        let p = Problem::from_toml("keys.toml", text, &e);
        assert!(!p.message.is_empty(), "{p}");
        assert_eq!(p.line, Some(3), "{p}");
    }
}
