//! Import circles, refused by `cargo xtask test`. A circle is two modules that each need the
//! other, directly or through others: neither can be read, tested or moved alone.
//!
//! Two graphs per crate, built from every path a module names (`use` trees and paths in code,
//! `#[cfg(test)]` items left out):
//! - between files: a module and its own descendants count as one unit (a parent naming its
//!   children, or a child its parent's items, is no circle);
//! - between top-level modules (the files and folders directly under `src/`): a folder loop,
//!   such as `config/` needing `vrrp/` and `vrrp/` needing `config/`, is a circle too.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use syn::visit::Visit;

/// A module by its path under the crate root (`["k8s", "source"]`); the root is empty.
type Module = Vec<String>;

/// The crates whose modules are checked.
pub const CRATES: &[&str] = &["lb-agent", "lb-common", "lb-ebpf", "xtask", "tests"];

/// Checks every crate; an error lists each circle with a reference that closes it.
pub fn check(workspace: &Path) -> Result<()> {
    let mut circles = Vec::new();
    for name in CRATES {
        let src = workspace.join(name).join("src");
        circles.extend(crate_circles(&src)?.into_iter().map(|c| format!("{name}: {c}")));
    }
    if !circles.is_empty() {
        bail!("import circles (see xtask/src/modules.rs):\n  {}", circles.join("\n  "));
    }
    eprintln!("modules: no import circles in {}", CRATES.join(", "));
    Ok(())
}

/// The circles of the crate at `src`, described.
pub fn crate_circles(src: &Path) -> Result<Vec<String>> {
    let mut parsed_files = BTreeMap::new();
    for (module, file) in module_files(src)? {
        let text = fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let parsed = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        parsed_files.insert(module, parsed);
    }
    // A file declared `#[cfg(test)] mod tests;` is test code, as an inline test module is.
    let test_files: BTreeSet<Module> = parsed_files
        .iter()
        .flat_map(|(module, parsed)| {
            parsed.items.iter().filter_map(move |item| match item {
                syn::Item::Mod(m) if m.content.is_none() && is_test_only(&m.attrs) => {
                    Some(with(module, m.ident.to_string()))
                }
                _ => None,
            })
        })
        .collect();
    parsed_files.retain(|module, _| !test_files.iter().any(|t| module.starts_with(t)));
    let modules: BTreeSet<Module> = parsed_files.keys().cloned().collect();
    // Each edge with one path that makes it, for the message.
    let mut edges: BTreeMap<(Module, Module), String> = BTreeMap::new();
    for (module, parsed) in &parsed_files {
        let mut paths = Paths::default();
        paths.visit_file(parsed);
        for path in paths.found {
            let Some(target) = resolve(module, &path, &modules) else { continue };
            if !related(module, &target) {
                edges.entry((module.clone(), target)).or_insert_with(|| path.join("::"));
            }
        }
    }
    let mut circles = Vec::new();
    let file_graph: BTreeMap<Module, BTreeSet<Module>> = graph(edges.keys().cloned());
    for component in cycles(&file_graph) {
        circles.push(describe("files", &component, &edges, |m| m.clone()));
    }
    let top = |m: &Module| m.iter().take(1).cloned().collect::<Module>();
    let top_graph = graph(edges.keys().map(|(a, b)| (top(a), top(b))).filter(|(a, b)| a != b));
    for component in cycles(&top_graph) {
        circles.push(describe("top-level modules", &component, &edges, top));
    }
    Ok(circles)
}

fn graph(edges: impl Iterator<Item = (Module, Module)>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (a, b) in edges {
        graph.entry(b.clone()).or_default();
        graph.entry(a).or_default().insert(b);
    }
    graph
}

/// `kind` [a, b, …], with each edge inside the circle and a path that makes it.
fn describe(
    kind: &str,
    component: &BTreeSet<Module>,
    edges: &BTreeMap<(Module, Module), String>,
    unit: impl Fn(&Module) -> Module,
) -> String {
    let name = |m: &Module| if m.is_empty() { "<root>".to_owned() } else { m.join("/") };
    let members: Vec<String> = component.iter().map(name).collect();
    let mut inside: BTreeMap<(Module, Module), &str> = BTreeMap::new();
    for ((a, b), path) in edges {
        let (ua, ub) = (unit(a), unit(b));
        if ua != ub && component.contains(&ua) && component.contains(&ub) {
            inside.entry((ua, ub)).or_insert(path);
        }
    }
    let why: Vec<String> =
        inside.iter().map(|((a, b), path)| format!("{} → {} ({path})", name(a), name(b))).collect();
    format!("circle between {kind} [{}]: {}", members.join(", "), why.join("; "))
}

/// Strongly connected components of more than one module (Tarjan).
fn cycles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<BTreeSet<Module>> {
    struct State<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        found: Vec<BTreeSet<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        for w in &s.graph[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.stack.contains(&w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                component.insert(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut state =
        State { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in graph.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// One is the other or an ancestor of it.
fn related(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The file module `path` (as written in `module`) names: the longest module its resolved
/// segments start with. None for paths into other crates.
fn resolve(module: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let (mut absolute, rest): (Module, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (module.clone(), &path[1..]),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            (module[..module.len().checked_sub(ups)?].to_vec(), &path[ups..])
        }
        _ => return None,
    };
    absolute.extend(rest.iter().cloned());
    while !modules.contains(&absolute) {
        absolute.pop()?;
    }
    Some(absolute)
}

/// Every `.rs` file under `src` as its module: `lib.rs`/`main.rs` the root, `a/mod.rs` and
/// `a.rs` module `a`. Binaries under `src/bin` are crates of their own and left out.
fn module_files(src: &Path) -> Result<BTreeMap<Module, PathBuf>> {
    let mut files = BTreeMap::new();
    for path in crate::files::with_extension(src, "rs", |dir| dir == src.join("bin"))? {
        let relative = path.strip_prefix(src)?.to_path_buf();
        let mut module: Module =
            relative.with_extension("").iter().map(|s| s.to_string_lossy().into_owned()).collect();
        if module.len() == 1 && matches!(module[0].as_str(), "lib" | "main") {
            module.clear();
        } else if module.last().is_some_and(|l| l == "mod") {
            module.pop();
        }
        files.insert(module, path);
    }
    Ok(files)
}

/// The paths a file names outside its `#[cfg(test)]` items: each `use` tree expanded, and
/// every path in code.
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.found.push(with(prefix, n.ident.to_string())),
            syn::UseTree::Rename(r) => self.found.push(with(prefix, r.ident.to_string())),
            syn::UseTree::Glob(_) => self.found.push(prefix.clone()),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

fn with(prefix: &[String], last: String) -> Vec<String> {
    prefix.iter().cloned().chain([last]).collect()
}

pub(crate) fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.meta.require_list().is_ok_and(|l| l.tokens.to_string().contains("test"))
    })
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.found.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> Vec<String> {
        let dir = std::env::temp_dir().join(format!("xtask-modules-{}-{}", std::process::id(), files.len()));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        let circles = crate_circles(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        circles
    }

    #[test]
    fn finds_a_circle_between_siblings_and_between_folders_but_not_parent_and_child() {
        let circles = crate_of(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;\nuse crate::a::A;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "pub struct B; fn f() { let _ = crate::a::A; }"),
            ("c/mod.rs", "mod d; use self::d::D; pub struct C;"),
            ("c/d.rs", "use super::C; pub struct D;"),
        ]);
        assert_eq!(circles.len(), 2, "{circles:?}");
        assert!(
            circles[0].contains("files [a, b]") && circles[0].contains("b → a (crate::a::A)"),
            "{circles:?}"
        );
        assert!(circles[1].contains("top-level modules [a, b]"), "{circles:?}");
    }

    #[test]
    fn a_folder_loop_through_different_files_and_test_only_imports() {
        let circles = crate_of(&[
            ("lib.rs", "mod x; mod y;"),
            ("x/mod.rs", "mod p; mod q;"),
            ("x/p.rs", "use crate::y::r::R;"),
            ("x/q.rs", "pub struct Q;"),
            ("y/mod.rs", "pub mod r; mod s;"),
            ("y/r.rs", "pub struct R;"),
            ("y/s.rs", "use crate::x::q::Q;\n#[cfg(test)]\nmod tests { use crate::x::p; }"),
        ]);
        assert_eq!(circles.len(), 1, "{circles:?}");
        assert!(circles[0].contains("top-level modules [x, y]"), "{circles:?}");
    }

    #[test]
    fn a_test_module_in_a_file_of_its_own_is_test_code() {
        let circles = crate_of(&[
            ("lib.rs", "mod a; mod b;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "pub struct B;\n#[cfg(test)]\nmod tests;"),
            ("b/tests.rs", "use crate::a::A;"),
        ]);
        assert!(circles.is_empty(), "{circles:?}");
    }
}
