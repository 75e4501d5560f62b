//! A config problem names file, line and field. Loading collects them all.

use std::fmt;

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
        Problem::new(file, line, &field, e.message().trim().to_string())
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
