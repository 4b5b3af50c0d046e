//! No circle of imports inside a crate: each crate's files, as modules, with an arrow for every `crate::`, `super::` and child path one names (a re-export followed to the file that defines the name), may not import each other round.
//!
//! A module naming its own ancestor (`use super::*`, `crate::Error` at a
//! crate's root) is how Rust lays out a folder and is not an arrow; a
//! parent naming its child is. Test code is left out, as it is of the
//! crates' own layering.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use petgraph::algo::tarjan_scc;
use petgraph::graph::DiGraph;
use syn::visit::Visit;

const CRATES: &[&str] = &[
    "protocol", "store", "node", "cli", "sim", "tests", "benches",
];

type Module = Vec<String>;

/// One crate's modules: the file of each, and the names each re-exports
/// (`pub use child::Name`) with the module the name comes from.
struct Crate {
    files: BTreeMap<Module, PathBuf>,
    exports: BTreeMap<Module, BTreeMap<String, Module>>,
    asts: BTreeMap<Module, syn::File>,
}

fn module_of(src: &Path, file: &Path) -> Option<Module> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if !(parts.is_empty() && (stem == "lib" || stem == "main")) && stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

fn load(src: &Path) -> Crate {
    let mut paths = Vec::new();
    super::tidy::rust_files(src, &mut paths);
    let mut krate = Crate {
        files: BTreeMap::new(),
        exports: BTreeMap::new(),
        asts: BTreeMap::new(),
    };
    for p in paths {
        // Benches and binaries beside a crate's library are crates of their own.
        if p.components()
            .any(|c| c.as_os_str() == "bin" || c.as_os_str() == "benches")
            || p.file_name().is_some_and(|n| n == "tests.rs")
        {
            continue;
        }
        let Some(m) = module_of(src, &p) else {
            continue;
        };
        let text = fs::read_to_string(&p).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        krate.files.insert(m.clone(), p);
        krate.asts.insert(m, ast);
    }
    let mods: Vec<Module> = krate.asts.keys().cloned().collect();
    for m in mods {
        let mut ex = BTreeMap::new();
        for item in &krate.asts[&m].items {
            if let syn::Item::Use(u) = item {
                if matches!(u.vis, syn::Visibility::Inherited) {
                    continue;
                }
                for (path, name) in expand(&u.tree) {
                    if let Some(target) = resolve(&krate, &m, &path, false) {
                        ex.insert(name, target);
                    }
                }
            }
        }
        krate.exports.insert(m, ex);
    }
    krate
}

/// A `use` tree as whole paths, each with the name it brings in.
fn expand(tree: &syn::UseTree) -> Vec<(Vec<String>, String)> {
    fn walk(t: &syn::UseTree, at: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
        match t {
            syn::UseTree::Path(p) => {
                at.push(p.ident.to_string());
                walk(&p.tree, at, out);
                at.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = at.clone();
                full.push(n.ident.to_string());
                out.push((full, n.ident.to_string()));
            }
            syn::UseTree::Rename(r) => {
                let mut full = at.clone();
                full.push(r.ident.to_string());
                out.push((full, r.rename.to_string()));
            }
            syn::UseTree::Glob(_) => out.push((at.clone(), "*".into())),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    walk(t, at, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(tree, &mut Vec::new(), &mut out);
    out
}

/// The module a path from module `from` names: `crate::`, `super::`,
/// `self::` or (in a `use`, `relative`) a child's name first; the longest
/// module it starts with, and through that module's re-exports the one
/// that defines the name. None for paths outside the crate.
fn resolve(k: &Crate, from: &Module, path: &[String], follow: bool) -> Option<Module> {
    let (mut at, rest): (Module, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (from.clone(), &path[1..]),
        "super" => {
            let mut m = from.clone();
            let mut i = 0;
            while path.get(i).is_some_and(|s| s == "super") {
                m.pop();
                i += 1;
            }
            (m, &path[i..])
        }
        first => {
            let mut child = from.clone();
            child.push(first.to_string());
            if !k.files.contains_key(&child) {
                return None;
            }
            (from.clone(), path)
        }
    };
    let mut i = 0;
    while i < rest.len() {
        let mut next = at.clone();
        next.push(rest[i].clone());
        if !k.files.contains_key(&next) {
            break;
        }
        at = next;
        i += 1;
    }
    if follow {
        if let Some(name) = rest.get(i) {
            let mut seen = 0;
            while let Some(t) = k.exports.get(&at).and_then(|e| e.get(name)) {
                if *t == at || seen > 8 {
                    break;
                }
                at = t.clone();
                seen += 1;
            }
        }
    }
    Some(at)
}

/// Every path a file names, outside its test code.
struct Paths {
    uses: Vec<Vec<String>>,
    inline: Vec<Vec<String>>,
}

impl<'a> Visit<'a> for Paths {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        if !is_test(&u.attrs) {
            self.uses
                .extend(expand(&u.tree).into_iter().map(|(p, _)| p));
        }
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs
            .first()
            .is_some_and(|s| s == "crate" || s == "super" || s == "self")
        {
            self.inline.push(segs);
        }
        syn::visit::visit_path(self, p);
    }
}

/// The arrows between a crate's files: (from, to), neither an ancestor of the other's way up.
fn arrows(k: &Crate) -> BTreeSet<(Module, Module)> {
    let mut out = BTreeSet::new();
    for (m, ast) in &k.asts {
        let mut v = Paths {
            uses: Vec::new(),
            inline: Vec::new(),
        };
        v.visit_file(ast);
        let named = v.uses.iter().chain(&v.inline);
        for path in named {
            let Some(t) = resolve(k, m, path, true) else {
                continue;
            };
            // Naming oneself or an ancestor is the folder's layout.
            if t.len() <= m.len() && m[..t.len()] == t[..] {
                continue;
            }
            out.insert((m.clone(), t));
        }
    }
    out
}

/// The circles of the crate whose sources are `src`: each the files in it,
/// as paths from `base`, sorted and joined by spaces.
fn circles(src: &Path, base: &Path) -> Vec<String> {
    let k = load(src);
    let mut g = DiGraph::<Module, ()>::new();
    let idx: BTreeMap<Module, _> = k
        .files
        .keys()
        .map(|m| (m.clone(), g.add_node(m.clone())))
        .collect();
    for (a, b) in arrows(&k) {
        g.add_edge(idx[&a], idx[&b], ());
    }
    let mut out = Vec::new();
    for scc in tarjan_scc(&g) {
        if scc.len() < 2 {
            continue;
        }
        let mut files: Vec<String> = scc
            .iter()
            .map(|&n| {
                let p = &k.files[&g[n]];
                p.strip_prefix(base)
                    .unwrap_or(p)
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        files.sort();
        out.push(files.join(" "));
    }
    out.sort();
    out
}

#[test]
fn no_crate_imports_its_own_files_round_in_a_circle() {
    let root = super::tidy::root().canonicalize().unwrap();
    let mut found = Vec::new();
    for c in CRATES {
        found.extend(circles(&root.join(c).join("src"), &root));
    }
    assert!(
        found.is_empty(),
        "circles of imports inside a crate (move what both need into a room of its own, \
         or let one side ask through a value it is given): {found:#?}"
    );
}

#[test]
fn a_circle_is_found_through_super_a_group_and_a_re_export_and_a_layout_is_not_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("room")).unwrap();
    let write = |p: &str, text: &str| fs::write(src.join(p), text).unwrap();
    write(
        "lib.rs",
        "//! x\nmod a;\nmod b;\nmod room;\npub use a::Apple;\n",
    );
    // a names b inside a group; b names a through the root's re-export.
    write(
        "a.rs",
        "//! x\nuse crate::{b::Bee, room::Ok};\npub struct Apple;\n",
    );
    write("b.rs", "//! x\npub struct Bee(crate::Apple);\n");
    // A parent and its child naming each other is the folder's layout.
    write("room/mod.rs", "//! x\nmod inner;\npub use inner::Ok;\n");
    write("room/inner.rs", "//! x\nuse super::*;\npub struct Ok;\n");
    assert_eq!(circles(&src, &src), vec!["a.rs b.rs".to_string()]);
    // Without b's arrow back, no circle.
    write("b.rs", "//! x\npub struct Bee;\n");
    assert!(circles(&src, &src).is_empty());
    // Through super:: between siblings in a folder, and only outside tests.
    write(
        "room/inner.rs",
        "//! x\nuse super::other::O;\npub struct Ok;\n",
    );
    write(
        "room/other.rs",
        "//! x\npub struct O;\n#[cfg(test)]\nmod tests { use super::super::inner::Ok; }\n",
    );
    write(
        "room/mod.rs",
        "//! x\nmod inner;\nmod other;\npub use inner::Ok;\n",
    );
    assert!(circles(&src, &src).is_empty());
    write("room/other.rs", "//! x\npub struct O(super::inner::Ok);\n");
    assert_eq!(
        circles(&src, &src),
        vec!["room/inner.rs room/other.rs".to_string()]
    );
}
