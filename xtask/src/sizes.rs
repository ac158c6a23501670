//! Sizes a newcomer can read, refused by `cargo xtask test` past them: no lb-agent source file
//! over [`MAX_FILE_LINES`] lines, no function over [`MAX_FN_LINES`] (test code included for
//! files, left out for functions).
//!
//! The functions still over the limit are listed in [`LONGER_FOR_NOW`] with their length today:
//! one may shrink (then its entry is lowered or removed), never grow, and no new one may join.

use std::{fs, path::Path};

use anyhow::{Context, Result, bail};
use syn::visit::Visit;

pub const MAX_FILE_LINES: usize = 600;
pub const MAX_FN_LINES: usize = 80;

/// `(file under lb-agent/src, function, lines today)`: the functions still to split.
const LONGER_FOR_NOW: &[(&str, &str, usize)] = &[];

/// Checks lb-agent's sources; an error lists every file and function over its limit.
pub fn check(workspace: &Path) -> Result<()> {
    let src = workspace.join("lb-agent/src");
    let mut over = Vec::new();
    let mut listed_seen = Vec::new();
    for (relative, text) in sources(&src)? {
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            over.push(format!("{relative}: {lines} lines (at most {MAX_FILE_LINES})"));
        }
        // A module's tests in a file of their own (`#[cfg(test)] mod tests;`) are test code.
        let test_file = relative.ends_with("tests.rs") || relative.contains("/tests/");
        if !test_file {
            let (long, seen) = long_functions(&relative, &text)?;
            over.extend(long);
            listed_seen.extend(seen);
        }
    }
    for &(file, name, today) in LONGER_FOR_NOW {
        match listed_seen.iter().find(|(f, n, _)| f == file && n == name) {
            None => over.push(format!("{file}: fn {name} is listed in LONGER_FOR_NOW but gone: remove its entry")),
            Some((_, _, lines)) if *lines < today => over.push(format!(
                "{file}: fn {name} is {lines} lines now, listed at {today}: lower its entry (or remove it at {MAX_FN_LINES} or less)"
            )),
            Some(_) => {}
        }
    }
    if !over.is_empty() {
        bail!("too long (see xtask/src/sizes.rs):\n  {}", over.join("\n  "));
    }
    eprintln!(
        "sizes: no lb-agent file over {MAX_FILE_LINES} lines, no function over {MAX_FN_LINES} but those listed"
    );
    Ok(())
}

/// The functions of `text` over the limit, or over their listed length, described; and the
/// listed ones found, with their length.
type Listed = (String, String, usize);
fn long_functions(relative: &str, text: &str) -> Result<(Vec<String>, Vec<Listed>)> {
    let parsed = syn::parse_file(text).with_context(|| format!("parsing {relative}"))?;
    let mut lengths = Lengths::default();
    lengths.visit_file(&parsed);
    let mut over = Vec::new();
    let mut listed = Vec::new();
    for (name, lines) in lengths.found {
        let entry = LONGER_FOR_NOW.iter().find(|(file, f, _)| *file == relative && *f == name);
        if entry.is_some() {
            listed.push((relative.to_owned(), name.clone(), lines));
        }
        let allowed = entry.map_or(MAX_FN_LINES, |(_, _, today)| *today);
        if lines > allowed {
            over.push(format!("{relative}: fn {name} is {lines} lines (at most {allowed})"));
        }
    }
    Ok((over, listed))
}

/// Every `.rs` file under `src`, by its path relative to it, with its text.
fn sources(src: &Path) -> Result<Vec<(String, String)>> {
    crate::files::with_extension(src, "rs", |_| false)?
        .into_iter()
        .map(|path| {
            let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok((path.strip_prefix(src)?.to_string_lossy().into_owned(), text))
        })
        .collect()
}

/// Each function's name and length in lines (signature to closing brace), outside test code.
#[derive(Default)]
struct Lengths {
    found: Vec<(String, usize)>,
    /// The type of the `impl` being visited: methods are named `Type::method`.
    self_type: Option<String>,
}

/// `#[cfg(test)]` code (as the module check reads it) or a `#[test]` function.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    crate::modules::is_test_only(attrs) || attrs.iter().any(|a| a.path().is_ident("test"))
}

fn lines_of(start: proc_macro2::Span, end: proc_macro2::Span) -> usize {
    end.end().line - start.start().line + 1
}

impl<'ast> Visit<'ast> for Lengths {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if is_test(&item.attrs) {
            return;
        }
        let lines = lines_of(item.sig.fn_token.span, item.block.brace_token.span.close());
        self.found.push((item.sig.ident.to_string(), lines));
        syn::visit::visit_item_fn(self, item);
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        let name = match &*item.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.self_type, name);
        syn::visit::visit_item_impl(self, item);
        self.self_type = outer;
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if is_test(&item.attrs) {
            return;
        }
        let lines = lines_of(item.sig.fn_token.span, item.block.brace_token.span.close());
        let name = match &self.self_type {
            Some(ty) => format!("{ty}::{}", item.sig.ident),
            None => item.sig.ident.to_string(),
        };
        self.found.push((name, lines));
        syn::visit::visit_impl_item_fn(self, item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_functions_from_signature_to_brace_and_skips_test_code() {
        let body = "    let x = 1;\n".repeat(MAX_FN_LINES);
        let text = format!(
            "fn short() {{}}\nfn long() {{\n{body}}}\nimpl S {{\n    fn method() {{\n{body}    }}\n}}\n\
             #[cfg(test)]\nmod tests {{\n    fn helper() {{\n{body}    }}\n}}\n#[test]\nfn case() {{\n{body}}}\n"
        );
        let (over, _) = long_functions("x.rs", &text).unwrap();
        assert_eq!(over.len(), 2, "{over:?}");
        assert!(over[0].contains("fn long is 82 lines"), "{over:?}");
        assert!(over[1].contains("fn S::method is 82 lines"), "{over:?}");
    }
}
