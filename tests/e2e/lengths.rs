//! No function passes 150 lines: each crate's functions and methods, measured by syn from their first line to their last (the list of those over the cap that could only shrink is empty now, and gone).
//!
//! Test code is left out (`#[cfg(test)]` modules and `tests.rs` files),
//! as it is of the other tidy checks: a long test reads top to bottom.

use std::collections::BTreeMap;
use std::fs;

use syn::spanned::Spanned;
use syn::visit::Visit;

/// The most lines a function may have.
const FN_LINES_MAX: usize = 150;

struct Lengths<'a> {
    file: &'a str,
    found: Vec<(String, String, usize)>,
}

impl Lengths<'_> {
    fn measure(&mut self, name: String, span: proc_macro2::Span) {
        let lines = span.end().line + 1 - span.start().line;
        if lines > FN_LINES_MAX {
            self.found.push((self.file.to_string(), name, lines));
        }
    }
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            self.measure(f.sig.ident.to_string(), f.span());
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            self.measure(f.sig.ident.to_string(), f.span());
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
}

/// Every function over the cap in `text`, as (file, name, lines).
fn long_fns(file: &str, text: &str) -> Vec<(String, String, usize)> {
    let ast = syn::parse_file(text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut v = Lengths {
        file,
        found: Vec::new(),
    };
    v.visit_file(&ast);
    v.found
}

#[test]
fn no_function_is_over_150_lines() {
    let root = super::tidy::root();
    let mut found: BTreeMap<(String, String), usize> = BTreeMap::new();
    for krate in [
        "protocol", "store", "node", "cli", "sim", "tests", "benches",
    ] {
        let mut paths = Vec::new();
        super::tidy::rust_files(&root.join(krate), &mut paths);
        for p in paths {
            if p.file_name().is_some_and(|n| n == "tests.rs")
                || p.components().any(|c| c.as_os_str() == "e2e")
            {
                continue;
            }
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let text = fs::read_to_string(&p).unwrap();
            for (file, name, lines) in long_fns(&rel, &text) {
                found.insert((file, name), lines);
            }
        }
    }
    let long: Vec<String> = found
        .iter()
        .map(|((file, name), lines)| format!("{file}: {name} is {lines} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "functions over {FN_LINES_MAX} lines (cut one in parts that each say what they do): {long:#?}"
    );
}

#[test]
fn long_functions_are_found_in_impls_and_not_in_tests() {
    let body = "    let x = 1;\n".repeat(FN_LINES_MAX);
    let text = format!(
        "fn short() {{}}\n\
         fn long() {{\n{body}}}\n\
         impl S {{\n    fn method(&self) {{\n{body}    }}\n}}\n\
         #[cfg(test)]\nmod tests {{\n    fn in_test() {{\n{body}    }}\n}}\n"
    );
    let found: Vec<(String, usize)> = long_fns("x.rs", &text)
        .into_iter()
        .map(|(_, n, l)| (n, l))
        .collect();
    assert_eq!(
        found,
        [
            ("long".to_string(), FN_LINES_MAX + 2),
            ("method".to_string(), FN_LINES_MAX + 2)
        ]
    );
}
