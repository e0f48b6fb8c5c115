//! Inert text: the one sanitizer every text and Markdown output goes through.
//!
//! Why this exists: most of the text LoopX shows was written by someone other than the operator
//! reading it. Agents write todo titles, details, evidence and run summaries; plugins write
//! proposals, observations, provider targets and error text; any caller can put bytes into a
//! flag that comes back in an error message. Printed raw, that text could clear the screen,
//! retitle the terminal, hide itself (`ESC [8m`), overwrite what came before it (`\r`, `\x08`),
//! or reorder what the operator reads (bidi overrides) just before they resolve a gate. So text
//! from outside is made *inert* at the last step before it reaches a terminal or a Markdown file:
//! every character that a terminal or a Markdown renderer would act on, or that shows as nothing,
//! is written as a visible escape instead. JSON output is never passed through here: JSON keeps
//! the exact text, and its own string escaping already makes it safe to parse.
//!
//! What is escaped, in every form:
//! - C0 controls (U+0000..U+001F, which includes ESC, BEL, backspace and CR), DEL (U+007F) and the
//!   C1 controls (U+0080..U+009F, which some terminals execute like their ESC-led forms);
//! - bidirectional controls: U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069;
//! - other characters that render as nothing or move text: the rest of Unicode's format
//!   characters (category Cf: soft hyphen, zero-width space, word joiner, BOM, interlinear
//!   annotation, the tag characters that can smuggle invisible ASCII, ...), the line and paragraph
//!   separators U+2028/U+2029, the Hangul fillers that are letters drawn as blanks, and variation
//!   selectors 17-256 (U+E0100..U+E01EF), which draw nothing and can carry hidden bytes.
//!   Zero-width joiner and non-joiner (U+200D, U+200C) and variation selectors 1-16 (U+FE00..
//!   U+FE0F) are kept: emoji sequences and several scripts need them, and they can neither hide
//!   nor move text.
//!
//! The escaped form is the one Rust's `char::escape_debug` uses for these characters: `\n`, `\r`,
//! `\t`, and `\u{hex}` (lowercase, no padding) for everything else, e.g. `\u{1b}`, `\u{202e}`.
//! Backslashes in the input are not doubled, so the form is for reading, not for decoding: the
//! exact text is in the JSON output and the JSON projections.
//!
//! Single-line fields (titles, table cells, headings, list items) escape `\n` and `\t` too, so no
//! value can break the layout it sits in. Multi-line bodies ([`text`]: paragraphs, error messages)
//! keep line breaks and tabs, which move the cursor only forward and down.
//!
//! Markdown adds a second rule: a value must not create Markdown structure, because a renderer
//! can hide text with it (an HTML comment or tag, an image in place of its alt text, a character
//! reference that decodes to a bidi override) or let it leave its line or table cell. Inline
//! values ([`md_inline`]) escape line breaks as above and put a backslash before `\`, `` ` ``,
//! `<`, `&`, `[`, `]` and `|`, which leaves no HTML, reference, link, image, code span or cell
//! break; emphasis stays possible, as it hides nothing. A multi-line value ([`md_block`]) is
//! written as a fenced code block longer than any backtick run inside it, where nothing is
//! Markdown; a one-line one is written inline with a leading block marker (`#`, `>`, `-`, ...)
//! escaped.
//!
//! Cost: these run on every projection refresh, so text that needs nothing (nearly all of it) is
//! checked with one pass over its bytes and returned borrowed; only text with something to escape
//! allocates.

use std::borrow::Cow;
use std::fmt::Write as _;

/// How much a caller's context tolerates.
#[derive(Debug, Clone, Copy)]
struct Mode {
    /// Keep `\n` and `\t` (multi-line bodies).
    multiline: bool,
    /// Backslash-escape the ASCII punctuation that opens Markdown inline structure.
    markdown: bool,
    /// Bit `b` set when this mode escapes the ASCII byte `b`: [`first_unsafe`] judges nearly
    /// every byte it sees with one shift instead of walking [`is_hidden`]'s ranges.
    ascii: u128,
}

impl Mode {
    const fn new(multiline: bool, markdown: bool) -> Mode {
        let mut mode = Mode {
            multiline,
            markdown,
            ascii: 0,
        };
        let mut b = 0u8;
        while b < 0x80 {
            if needs_escape(b as char, mode) {
                mode.ascii |= 1 << b;
            }
            b += 1;
        }
        mode
    }

    fn escapes_ascii(self, b: u8) -> bool {
        b < 0x80 && (self.ascii >> b) & 1 == 1
    }
}

const LINE: Mode = Mode::new(false, false);
const TEXT: Mode = Mode::new(true, false);
const MD_INLINE: Mode = Mode::new(false, true);

/// One line for a terminal: every control and invisible character escaped, `\n` and `\t` too.
pub fn line(s: &str) -> Cow<'_, str> {
    escape(s, LINE)
}

/// A multi-line body for a terminal: like [`line`], but line breaks and tabs are kept.
pub fn text(s: &str) -> Cow<'_, str> {
    escape(s, TEXT)
}

/// A value inside a line of Markdown (heading, list item, table cell): escaped as [`line`], and
/// unable to open any Markdown inline structure or leave its table cell.
pub fn md_inline(s: &str) -> Cow<'_, str> {
    escape(s, MD_INLINE)
}

/// Appends [`md_inline`] of `s` to `out` without an intermediate allocation (projection renderers
/// push many small values into one buffer).
pub fn push_md_inline(out: &mut String, s: &str) {
    match first_unsafe(s, MD_INLINE) {
        None => out.push_str(s),
        Some(at) => {
            out.push_str(&s[..at]);
            escape_from(out, &s[at..], MD_INLINE);
        }
    }
}

/// A Markdown body that starts on its own line (a paragraph): a value with a line break becomes a
/// fenced code block, in which nothing is Markdown; a one-line value is [`md_inline`] with a
/// leading block marker escaped, so it stays one paragraph.
pub fn md_block(s: &str) -> Cow<'_, str> {
    if s.contains(['\n', '\r']) {
        let body = text(s);
        let fence = "`".repeat(longest_backtick_run(&body).max(2) + 1);
        return Cow::Owned(format!("{fence}text\n{body}\n{fence}"));
    }
    let inline = md_inline(s);
    // `-`, `+`, `*`: list items or a thematic break; `#` a heading; `>` a quote; `=` and `-`
    // turn the line above into a heading; `~` opens a fence that runs to the end of the file; `_`
    // a thematic break. Backslash-escaping the first one leaves a plain paragraph.
    if inline.starts_with(['#', '>', '-', '+', '*', '=', '~', '_']) {
        return Cow::Owned(format!("\\{inline}"));
    }
    inline
}

/// A Markdown code span showing `s` (escaped as [`line`]): backslash escapes do not work inside
/// code spans, so the span is delimited by more backticks than any run inside it instead.
pub fn md_code(s: &str) -> String {
    let body = line(s);
    let ticks = "`".repeat(longest_backtick_run(&body) + 1);
    // A span that begins or ends with a backtick needs a space inside each delimiter (CommonMark
    // strips exactly one on each side); so does one that begins and ends with a space.
    let pad = if body.starts_with('`')
        || body.ends_with('`')
        || (body.starts_with(' ') && body.ends_with(' '))
        || body.is_empty()
    {
        " "
    } else {
        ""
    };
    format!("{ticks}{pad}{body}{pad}{ticks}")
}

fn longest_backtick_run(s: &str) -> usize {
    let (mut longest, mut run) = (0, 0);
    for b in s.bytes() {
        run = if b == b'`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    longest
}

/// True for every character the module escapes in all forms (see the module comment).
pub const fn is_hidden(c: char) -> bool {
    matches!(
        c,
        '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{ad}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{890}'..='\u{891}'
            | '\u{8e2}'
            | '\u{115f}'..='\u{1160}'
            | '\u{180e}'
            | '\u{200b}'
            | '\u{200e}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{3164}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0001}'
            | '\u{e0020}'..='\u{e007f}'
            | '\u{e0100}'..='\u{e01ef}'
    )
}

const fn needs_escape(c: char, mode: Mode) -> bool {
    if mode.multiline && (c == '\n' || c == '\t') {
        return false;
    }
    is_hidden(c) || (mode.markdown && is_md_special(c))
}

const fn is_md_special(c: char) -> bool {
    matches!(c, '\\' | '`' | '<' | '&' | '[' | ']' | '|')
}

/// Byte offset of the first character `mode` must escape. ASCII is judged byte by byte; only
/// non-ASCII characters are decoded.
fn first_unsafe(s: &str, mode: Mode) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b < 0x80 {
            if mode.escapes_ascii(b) {
                return Some(i);
            }
            i += 1;
        } else {
            // `i` is a character boundary: every byte before it was ASCII or a whole character.
            let c = s[i..].chars().next().expect("a character starts here");
            if needs_escape(c, mode) {
                return Some(i);
            }
            i += c.len_utf8();
        }
    }
    None
}

fn escape(s: &str, mode: Mode) -> Cow<'_, str> {
    match first_unsafe(s, mode) {
        None => Cow::Borrowed(s),
        Some(at) => {
            let mut out = String::with_capacity(s.len() + 16);
            out.push_str(&s[..at]);
            escape_from(&mut out, &s[at..], mode);
            Cow::Owned(out)
        }
    }
}

fn escape_from(out: &mut String, s: &str, mode: Mode) {
    for c in s.chars() {
        if !needs_escape(c, mode) {
            out.push(c);
        } else if mode.markdown && is_md_special(c) {
            out.push('\\');
            out.push(c);
        } else {
            match c {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str =
        "a\u{1b}]0;pwned\u{7}b\u{1b}[2J\u{1b}[8mhidden\u{9b}31m\u{202e}txt\r\u{8}z";

    fn is_borrowed(c: Cow<'_, str>) -> bool {
        matches!(c, Cow::Borrowed(_))
    }

    #[test]
    fn each_modes_ascii_mask_is_its_character_rule() {
        for mode in [LINE, TEXT, MD_INLINE] {
            for b in 0..=u8::MAX {
                let rule = b < 0x80 && needs_escape(b as char, mode);
                assert_eq!(mode.escapes_ascii(b), rule, "byte {b:#x} in {mode:?}");
            }
        }
        // The masks differ where the modes do.
        assert!(!TEXT.escapes_ascii(b'\n') && LINE.escapes_ascii(b'\n'));
        assert!(MD_INLINE.escapes_ascii(b'|') && !LINE.escapes_ascii(b'|'));
        assert!(LINE.escapes_ascii(0x1b) && LINE.escapes_ascii(0x7f) && !LINE.escapes_ascii(b'a'));
    }

    #[test]
    fn plain_text_is_returned_borrowed() {
        for s in [
            "",
            "Fix the flaky test",
            "é ✓ 日本語 👨‍👩‍👧",
            "a/b_c-d.e (1) #2 *x*",
        ] {
            assert!(is_borrowed(line(s)), "{s}");
            assert!(is_borrowed(text(s)), "{s}");
            assert!(is_borrowed(md_inline(s)), "{s}");
        }
        assert!(is_borrowed(text("two\nlines\tand a tab")));
    }

    #[test]
    fn controls_and_bidi_become_visible_escapes() {
        assert_eq!(
            line(HOSTILE),
            "a\\u{1b}]0;pwned\\u{7}b\\u{1b}[2J\\u{1b}[8mhidden\\u{9b}31m\\u{202e}txt\\r\\u{8}z"
        );
        assert_eq!(line("a\nb\tc\u{7f}"), "a\\nb\\tc\\u{7f}");
        assert_eq!(text("a\nb\tc\r\n"), "a\nb\tc\\r\n");
        for c in [
            '\u{0}',
            '\u{85}',
            '\u{61c}',
            '\u{200e}',
            '\u{200f}',
            '\u{202a}',
            '\u{2066}',
            '\u{2069}',
            '\u{200b}',
            '\u{2028}',
            '\u{2029}',
            '\u{feff}',
            '\u{e0041}',
            '\u{ad}',
        ] {
            let s = format!("x{c}y");
            let out = line(&s);
            assert_eq!(out, format!("x\\u{{{:x}}}y", c as u32), "{:x}", c as u32);
            assert!(!out.chars().any(is_hidden));
        }
        assert_eq!(line("a\u{e0100}"), "a\\u{e0100}");
        // Joiners and the variation selectors that emoji and scripts need are kept.
        assert!(is_borrowed(line("\u{2764}\u{fe0f}")));
        assert!(is_borrowed(line("a\u{200d}b\u{200c}c")));
    }

    #[test]
    fn no_output_form_leaves_a_hidden_character() {
        let all: String = (0..=0x10ffff_u32).filter_map(char::from_u32).collect();
        for out in [line(&all), text(&all), md_inline(&all), md_block(&all)] {
            assert!(!out.chars().any(|c| is_hidden(c) && c != '\n' && c != '\t'));
        }
        assert!(!line(&all).contains(['\n', '\t']));
        assert!(!md_inline(&all).contains(['\n', '\t']));
    }

    #[test]
    fn markdown_values_cannot_open_structure() {
        assert_eq!(
            md_inline("<!-- a | [x](y) ![i](u) &#8238; `c` \\<b>"),
            "\\<!-- a \\| \\[x\\](y) !\\[i\\](u) \\&#8238; \\`c\\` \\\\\\<b>"
        );
        assert_eq!(md_inline("line\nbreak"), "line\\nbreak");
        let mut out = String::from("- ");
        push_md_inline(&mut out, "t<i>tle");
        push_md_inline(&mut out, " ok");
        assert_eq!(out, "- t\\<i>tle ok");
    }

    #[test]
    fn markdown_blocks_stay_one_paragraph_or_one_fence() {
        assert_eq!(md_block("plain words"), "plain words");
        assert_eq!(md_block("# not a heading"), "\\# not a heading");
        assert_eq!(md_block("~~~"), "\\~~~");
        assert_eq!(
            md_block("one\n```\n## fake\n<!--"),
            "````text\none\n```\n## fake\n<!--\n````"
        );
        assert_eq!(md_block("a\r\nb"), "```text\na\\r\nb\n```");
    }

    #[test]
    fn code_spans_outnumber_the_backticks_inside() {
        assert_eq!(md_code("make test"), "`make test`");
        assert_eq!(md_code("a`b"), "``a`b``");
        assert_eq!(md_code("`x`"), "`` `x` ``");
        assert_eq!(md_code("x\u{1b}[2J"), "`x\\u{1b}[2J`");
    }
}
