//! Showing manifest text (item ids, targets) in one log or error line.
//!
//! Ids and targets come from the backend or a file. Control characters in
//! them could start a new line or move the cursor, and Unicode format
//! characters (U+202E RIGHT-TO-LEFT OVERRIDE, zero-width spaces, U+FEFF) or
//! the line and paragraph separators make a line read other than it is:
//! `skill<U+202E>txt.exe` shows as `skillexe.txt`. Shown escapes all of them as
//! `\u{202e}`, and leaves everything else as it is.

use std::fmt;

use unicode_general_category::{GeneralCategory, get_general_category};

/// Displays its text with control, format and separator characters
/// escaped; no allocation.
pub struct Shown<'a>(pub &'a str);

/// Whether `c` is shown escaped.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            get_general_category(c),
            GeneralCategory::Format | GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator
        )
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| hidden(c)) {
            f.write_str(&rest[..at])?;
            write!(f, "{}", c.escape_unicode())?;
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// [`Shown`] as a `String`.
pub fn shown(text: &str) -> String {
    Shown(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_control_format_and_separator_characters_only() {
        assert_eq!(shown("skill\u{202e}txt.exe"), "skill\\u{202e}txt.exe");
        assert_eq!(
            shown("a\u{200b}b\u{feff}c\u{2028}d\u{2029}e"),
            "a\\u{200b}b\\u{feff}c\\u{2028}d\\u{2029}e"
        );
        assert_eq!(shown("line\nbreak\t\u{1b}[31m"), "line\\u{a}break\\u{9}\\u{1b}[31m");
        assert_eq!(shown("ünïcödé 技能 skill:x/y z"), "ünïcödé 技能 skill:x/y z");
    }
}
