//! The book under `docs/` (mdBook): `cargo xtask docs` builds it into `target/book` and fails on
//! a broken internal link, in the book or in the README; `cargo xtask test` runs it. The bench
//! commands write their tables into the book's pages ([`write_bench_table`]), between markers.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{run, setup};

/// Builds the book and checks every internal link.
pub fn build(workspace: &Path) -> Result<()> {
    let mdbook = setup::mdbook()?;
    let out = workspace.join("target/book");
    run(Command::new(mdbook).arg("build").arg(workspace.join("docs")).arg("--dest-dir").arg(&out))?;
    let broken = broken_links(workspace)?;
    if !broken.is_empty() {
        bail!("broken links:\n  {}", broken.join("\n  "));
    }
    eprintln!("docs: the book is in {} and every internal link resolves", out.display());
    Ok(())
}

/// Every link in the README and the book's pages to a file or heading that does not exist.
pub fn broken_links(workspace: &Path) -> Result<Vec<String>> {
    let mut pages = vec![workspace.join("README.md")];
    pages.extend(crate::files::with_extension(&workspace.join("docs/src"), "md", |_| false)?);
    let mut broken = Vec::new();
    for page in &pages {
        let text = fs::read_to_string(page)?;
        for target in links(&text) {
            if let Err(why) = check_link(page, &target) {
                broken.push(format!("{}: ({target}) {why}", page.strip_prefix(workspace)?.display()));
            }
        }
    }
    Ok(broken)
}

/// Whether `target`, linked from `page`, names a file that exists and, after `#`, a heading
/// of that page.
fn check_link(page: &Path, target: &str) -> Result<(), String> {
    let (file, anchor) = target.split_once('#').map_or((target, None), |(f, a)| (f, Some(a)));
    let file: PathBuf =
        if file.is_empty() { page.to_path_buf() } else { page.parent().unwrap_or(Path::new(".")).join(file) };
    if !file.exists() {
        return Err("no such file".to_owned());
    }
    let Some(anchor) = anchor else { return Ok(()) };
    if file.extension().is_none_or(|e| e != "md") {
        return Ok(());
    }
    let text = fs::read_to_string(&file).map_err(|e| e.to_string())?;
    if anchors(&text).contains(anchor) {
        Ok(())
    } else {
        Err(format!("no heading with the anchor #{anchor}"))
    }
}

/// The targets of the Markdown links `[text](target)` outside code, other than to the web.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose_lines(text) {
        let line = strip_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            let external = ["http://", "https://", "mailto:"].iter().any(|p| target.starts_with(p));
            if !target.is_empty() && !external {
                found.push(target.to_owned());
            }
            rest = &rest[end..];
        }
    }
    found
}

/// The lines of `text` outside fenced code blocks (and not their fences).
fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

fn strip_code_spans(line: &str) -> String {
    line.split('`').enumerate().filter(|(i, _)| i % 2 == 0).map(|(_, part)| part).collect()
}

/// The anchors mdBook (and GitHub) give a page's headings: lower case, spaces as `-`, other
/// punctuation but `-` and `_` dropped; a repeated one gets `-1`, `-2`, …
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in prose_lines(text) {
        if !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let base: String = title
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect::<String>()
            .to_lowercase();
        let mut anchor = base.clone();
        let mut n = 0;
        while found.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        found.insert(anchor);
    }
    found
}

/// Whether the book has a place for the bench table `name`.
pub fn has_bench_table(workspace: &Path, name: &str) -> bool {
    let page = workspace.join("docs/src/benchmarks.md");
    fs::read_to_string(page).is_ok_and(|text| text.contains(&format!("<!-- bench:{name}:begin -->")))
}

/// Puts the Markdown tables of `output` (a bench's standard output) into the book's benchmarks
/// page: all of them between `<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->`, or,
/// where the page sets them apart with prose between, the k-th table between the markers
/// `bench:NAME:k:begin` and `bench:NAME:k:end`. Where the README has the first kind of
/// markers for `name` too, they get the same tables.
pub fn write_bench_table(workspace: &Path, name: &str, output: &str) -> Result<()> {
    let page = workspace.join("docs/src/benchmarks.md");
    let mut text = fs::read_to_string(&page).with_context(|| format!("reading {}", page.display()))?;
    let tables = tables(output);
    if tables.is_empty() {
        bail!("the bench printed no table for {name}");
    }
    if let Some(updated) = replace_between(&text, name, &tables.join("\n\n")) {
        text = updated;
    } else {
        let mut filled = 0;
        for (k, table) in tables.iter().enumerate() {
            let Some(updated) = replace_between(&text, &format!("{name}:{}", k + 1), table) else { break };
            text = updated;
            filled += 1;
        }
        if filled == 0 {
            bail!("{} has no markers <!-- bench:{name}:begin --> for this run's tables", page.display());
        }
        if filled < tables.len() {
            eprintln!("docs: {} of the {name} run's {} tables had a place", filled, tables.len());
        }
    }
    fs::write(&page, text)?;
    eprintln!("docs: the {name} tables are written into {}", page.display());
    let readme = workspace.join("README.md");
    let text = fs::read_to_string(&readme).with_context(|| format!("reading {}", readme.display()))?;
    if let Some(updated) = replace_between(&text, name, &tables.join("\n\n")) {
        fs::write(&readme, updated)?;
        eprintln!("docs: and into {}", readme.display());
    }
    Ok(())
}

/// The Markdown tables in `output`, each its run of lines starting with `|`.
fn tables(output: &str) -> Vec<String> {
    let mut tables: Vec<Vec<&str>> = Vec::new();
    let mut in_table = false;
    for line in output.lines() {
        let row = line.starts_with('|');
        if row && !in_table {
            tables.push(Vec::new());
        }
        if row {
            tables.last_mut().expect("pushed above").push(line);
        }
        in_table = row;
    }
    tables.into_iter().map(|t| t.join("\n")).collect()
}

/// `text` with what stands between the markers of `name` replaced by `content`; None when it
/// has no such markers.
fn replace_between(text: &str, name: &str, content: &str) -> Option<String> {
    let (begin, end) = (format!("<!-- bench:{name}:begin -->"), format!("<!-- bench:{name}:end -->"));
    let from = text.find(&begin)?;
    let to = from + text[from..].find(&end)?;
    Some(format!("{}{begin}\n{content}\n{}", &text[..from], &text[to..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_mdbook() {
        let a = anchors(
            "# Routed fabrics: BGP and ECMP\n## `cargo xtask bench bgp`\n## Tests\n## Tests\n```\n# not a heading\n```\n",
        );
        let want: BTreeSet<String> =
            ["routed-fabrics-bgp-and-ecmp", "cargo-xtask-bench-bgp", "tests", "tests-1"]
                .map(String::from)
                .into();
        assert_eq!(a, want);
    }

    #[test]
    fn links_outside_code_and_not_to_the_web() {
        let text =
            "see [a](a.md#x) and [b](https://e.org) `[c](c.md)`\n```\n[d](d.md)\n```\n[e](../e.rs \"title\")";
        assert_eq!(links(text), ["a.md#x", "../e.rs"]);
    }

    #[test]
    fn a_runs_tables_go_between_their_markers_whole_or_one_by_one() {
        let output = "progress\n| a |\n|---|\n| 1 |\nnote\n| b |\n|---|\n| 2 |\n";
        let whole = "x\n<!-- bench:r:begin -->\nold\n<!-- bench:r:end -->\ny\n";
        assert_eq!(
            replace_between(whole, "r", &tables(output).join("\n\n")).unwrap(),
            "x\n<!-- bench:r:begin -->\n| a |\n|---|\n| 1 |\n\n| b |\n|---|\n| 2 |\n<!-- bench:r:end -->\ny\n"
        );
        let apart = "<!-- bench:r:1:begin -->\nold\n<!-- bench:r:1:end -->\nprose\n<!-- bench:r:2:begin -->\n<!-- bench:r:2:end -->\n";
        let one = replace_between(apart, "r:1", &tables(output)[0]).unwrap();
        let two = replace_between(&one, "r:2", &tables(output)[1]).unwrap();
        assert_eq!(
            two,
            "<!-- bench:r:1:begin -->\n| a |\n|---|\n| 1 |\n<!-- bench:r:1:end -->\nprose\n<!-- bench:r:2:begin -->\n| b |\n|---|\n| 2 |\n<!-- bench:r:2:end -->\n"
        );
        assert!(replace_between(apart, "r", "z").is_none());
    }
}
