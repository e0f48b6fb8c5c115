//! One output type for every command: a JSON value for scripts and agents, and a small document
//! (headings, fields, tables, lists) rendered either as aligned plain text or as Markdown.
//!
//! Commands build both from the same data, so the three formats can never disagree about what
//! happened.
//!
//! Blocks hold the exact text, which may come from agents and plugins; the text and Markdown
//! renderers below pass every piece of it through [`crate::inert`] as they write it, so no
//! command can forget to, and JSON (rendered from `value`) keeps the exact text.
//!
//! Text tables are aligned by display width (`unicode-width`), not by characters: a CJK
//! character or an emoji takes two columns of a terminal.

use serde_json::Value;
use unicode_width::UnicodeWidthStr;

use crate::inert;

/// Stable version tag on every JSON object the CLI prints.
pub const CLI_SCHEMA: &str = "loopx.cli.v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    Markdown,
}

#[derive(Debug, Clone)]
pub enum Block {
    Heading(String),
    Fields(Vec<(String, String)>),
    Table {
        headers: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    Para(String),
    List(Vec<String>),
    /// Text the program itself generated (a completion script, a manual page), printed exactly
    /// as it is in text and Markdown. Never external text: that would bypass [`crate::inert`].
    Verbatim(String),
}

/// What a command prints.
#[derive(Debug, Clone)]
pub struct Output {
    pub value: Value,
    pub blocks: Vec<Block>,
    /// The exit code after printing: 0, or the code of a report that found what it looked for
    /// wrong (a damaged registry is exit 5 with the whole inspection printed, not only a message).
    pub exit_code: i32,
    /// The command printed its output itself as it went (`--watch`): nothing is left to print.
    pub streamed: bool,
}

impl Output {
    pub fn new(value: Value) -> Output {
        Output {
            value,
            blocks: Vec::new(),
            exit_code: 0,
            streamed: false,
        }
    }
    pub fn heading(mut self, text: impl Into<String>) -> Output {
        self.blocks.push(Block::Heading(text.into()));
        self
    }
    pub fn fields<K: Into<String>, V: Into<String>>(
        mut self,
        fields: impl IntoIterator<Item = (K, V)>,
    ) -> Output {
        self.blocks.push(Block::Fields(
            fields
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        ));
        self
    }
    pub fn table(mut self, headers: &[&str], rows: Vec<Vec<String>>) -> Output {
        self.blocks.push(Block::Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows,
        });
        self
    }
    pub fn para(mut self, text: impl Into<String>) -> Output {
        self.blocks.push(Block::Para(text.into()));
        self
    }
    pub fn list(mut self, items: Vec<String>) -> Output {
        self.blocks.push(Block::List(items));
        self
    }
    pub fn verbatim(mut self, text: String) -> Output {
        self.blocks.push(Block::Verbatim(text));
        self
    }

    /// What a command that printed its own output (`--watch`) returns.
    pub fn streamed(redraws: u64) -> Output {
        let mut out = Output::new(serde_json::json!({ "redraws": redraws }));
        out.streamed = true;
        out
    }

    /// The JSON value as printed: with `schema_version` and `ok`.
    pub fn json_value(&self) -> Value {
        let mut value = self.value.clone();
        if let Value::Object(map) = &mut value {
            map.entry("schema_version")
                .or_insert_with(|| Value::String(CLI_SCHEMA.to_string()));
            map.entry("ok").or_insert(Value::Bool(true));
        }
        value
    }

    pub fn render(&self, format: Format) -> String {
        if self.streamed {
            return String::new();
        }
        match format {
            Format::Json => {
                let mut s = serde_json::to_string_pretty(&self.json_value())
                    .expect("output values serialize");
                s.push('\n');
                s
            }
            Format::Text => render_text(&self.blocks),
            Format::Markdown => render_markdown(&self.blocks),
        }
    }
}

fn render_text(blocks: &[Block]) -> String {
    let mut out = String::new();
    for (i, block) in blocks.iter().enumerate() {
        if i > 0 && matches!(block, Block::Heading(_)) {
            out.push('\n');
        }
        match block {
            Block::Heading(h) => {
                out.push_str(&inert::line(h));
                out.push('\n');
            }
            Block::Fields(fields) => {
                let fields: Vec<_> = fields
                    .iter()
                    .map(|(k, v)| (inert::line(k), inert::line(v)))
                    .collect();
                let width = fields.iter().map(|(k, _)| k.width()).max().unwrap_or(0);
                for (k, v) in &fields {
                    out.push_str(&format!("  {}  {v}\n", pad(k, width)));
                }
            }
            Block::Table { headers, rows } => {
                if rows.is_empty() {
                    out.push_str("  (none)\n");
                    continue;
                }
                let cells = |row: &[String]| -> Vec<String> {
                    row.iter()
                        .map(|c| inert::line(&one_line(c)).into_owned())
                        .collect()
                };
                let (headers, rows) = (cells(headers), rows.iter().map(|r| cells(r)));
                let rows: Vec<Vec<String>> = rows.collect();
                let mut widths: Vec<usize> = headers.iter().map(|h| h.width()).collect();
                for row in &rows {
                    for (w, cell) in widths.iter_mut().zip(row) {
                        *w = (*w).max(cell.width());
                    }
                }
                let line = |cells: &[String]| {
                    let mut s = String::from(" ");
                    for (cell, w) in cells.iter().zip(&widths) {
                        s.push(' ');
                        s.push_str(&pad(cell, *w));
                    }
                    s.trim_end().to_string() + "\n"
                };
                out.push_str(&line(&headers));
                for row in &rows {
                    out.push_str(&line(row));
                }
            }
            Block::Para(p) => {
                out.push_str(&inert::text(p));
                out.push('\n');
            }
            Block::List(items) => {
                for item in items {
                    out.push_str(&format!("  - {}\n", inert::line(item)));
                }
            }
            Block::Verbatim(text) => out.push_str(text),
        }
    }
    out
}

/// `text` followed by spaces up to `width` terminal columns (its display width, not its
/// character count).
fn pad(text: &str, width: usize) -> String {
    let mut s = text.to_string();
    s.extend(std::iter::repeat_n(' ', width.saturating_sub(text.width())));
    s
}

/// A table cell on one line: multi-line values (evidence, plugin output) would break the columns.
fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join(" / ")
}

fn render_markdown(blocks: &[Block]) -> String {
    let mut out = String::new();
    let mut first_heading = true;
    for block in blocks {
        match block {
            Block::Heading(h) => {
                out.push_str(if first_heading { "# " } else { "## " });
                first_heading = false;
                out.push_str(&inert::md_inline(h));
                out.push_str("\n\n");
            }
            Block::Fields(fields) => {
                for (k, v) in fields {
                    let (k, v) = (inert::md_inline(k), inert::md_inline(v));
                    out.push_str(&format!("- **{k}**: {v}\n"));
                }
                out.push('\n');
            }
            Block::Table { headers, rows } => {
                if rows.is_empty() {
                    out.push_str("_(none)_\n\n");
                    continue;
                }
                let row_line = |cells: &[String]| {
                    let cells: Vec<_> = cells.iter().map(|c| inert::md_inline(c)).collect();
                    format!("| {} |\n", cells.join(" | "))
                };
                out.push_str(&row_line(headers));
                out.push_str(&format!("|{}\n", "---|".repeat(headers.len())));
                for row in rows {
                    out.push_str(&row_line(row));
                }
                out.push('\n');
            }
            Block::Para(p) => {
                out.push_str(&inert::md_block(p));
                out.push_str("\n\n");
            }
            Block::List(items) => {
                for item in items {
                    out.push_str(&format!("- {}\n", inert::md_inline(item)));
                }
                out.push('\n');
            }
            Block::Verbatim(text) => out.push_str(text),
        }
    }
    out
}
