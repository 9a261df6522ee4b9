//! The house rules, checked from the code's own text: the backend is built in floors that only
//! look down, and no two rooms of a floor lean on each other in a circle.
//!
//! | floor | modules | may use of ours |
//! |---|---|---|
//! | 0 | `ids`, `clock`, `metrics` | nothing (leaves anyone may call) |
//! | 1 | `store`, `mail` | floor 0 |
//! | 2 | `operations` | floors 0–1 |
//! | 3 | `workers` | floors 0–2 |
//! | 4 | `api` | floors 0–3 |
//! | 5 | the crate root (`lib.rs`: `run`, `Seams`), `cli`, `config` | everything |
//!
//! Below the HTTP floor nothing names a web framework (axum, tower, utoipa…): the store and the
//! operations would compile without them. Within a directory, a module may use its parent (the
//! room's shared core) and its siblings, but siblings never in a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floor of a module path (`store::keys` → 1).
fn floor(module: &[String]) -> u8 {
    match module.first().map(String::as_str) {
        Some("ids" | "clock" | "metrics") => 0,
        Some("store" | "mail") => 1,
        Some("operations") => 2,
        Some("workers") => 3,
        Some("api") => 4,
        _ => 5, // the crate root, cli, config
    }
}

/// What the floors below the HTTP layer must not name.
const WEB_CRATES: [&str; 6] = [
    "axum",
    "tower",
    "tower_http",
    "utoipa",
    "utoipa_swagger_ui",
    "metrics_exporter_prometheus",
];

struct Source {
    module: Vec<String>,
    is_mod_rs: bool,
    text: String,
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .into_iter()
        .filter(|path| path.file_name().is_some_and(|n| n != "main.rs"))
        .map(|path| {
            let relative = path.strip_prefix(&root).unwrap().with_extension("");
            let mut module: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let is_mod_rs = module.last().is_some_and(|m| m == "mod");
            if is_mod_rs || module == ["lib"] {
                module.pop();
            }
            Source {
                module,
                is_mod_rs,
                text: code_only(&std::fs::read_to_string(&path).unwrap()),
            }
        })
        .collect()
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The text without comments and without the `#[cfg(test)]` module at the end (a unit test may
/// reach anywhere).
fn code_only(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module of ours a file names (`crate::a::b…`, `use crate::{a, b::c}`, `super::x`), as a
/// path, with whether it was named by a `pub use` (a re-export) or a `mod` line.
fn references(source: &Source) -> Vec<(Vec<String>, bool)> {
    let mut found = Vec::new();
    let text = &source.text;
    for line in text.lines() {
        let reexport = line.trim_start().starts_with("pub use ");
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let path = path_of(item.trim());
                    if !path.is_empty() {
                        found.push((path, reexport));
                    }
                }
            } else {
                found.push((path_of(rest), reexport));
            }
        }
        for (at, _) in line.match_indices("super::") {
            if line[..at].ends_with("super::") {
                continue; // counted with the first `super::`
            }
            let mut base = source.module.clone();
            if !source.is_mod_rs {
                base.pop();
            }
            let mut rest = &line[at..];
            while let Some(next) = rest.strip_prefix("super::") {
                base.pop();
                rest = next;
            }
            // `super::` of a non-mod file names its own directory's module.
            let mut base = if source.is_mod_rs {
                base
            } else {
                parent(&source.module)
            };
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let mut path = base.clone();
                    path.extend(path_of(item.trim()));
                    found.push((path, reexport));
                }
            } else {
                base.extend(path_of(rest));
                found.push((base, reexport));
            }
        }
    }
    found
}

fn parent(module: &[String]) -> Vec<String> {
    module[..module.len().saturating_sub(1)].to_vec()
}

/// The leading `a::b::c` of a path, lowercase segments only (modules, not items).
fn path_of(text: &str) -> Vec<String> {
    text.split("::")
        .map(|s| {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .take_while(|s| !s.is_empty() && s.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .collect()
}

/// The module a path lands in: its longest prefix that is a module of ours.
fn resolve(path: &[String], modules: &BTreeSet<Vec<String>>) -> Vec<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| modules.contains(prefix))
        .unwrap_or_default()
}

#[test]
fn floors_only_look_down_and_no_rooms_lean_on_each_other_in_a_circle() {
    let sources = sources();
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let mut broken = Vec::new();
    // Sibling edges, for the circle check: (parent, from, to).
    let mut siblings: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for source in &sources {
        let here = floor(&source.module);
        for (path, reexport) in references(source) {
            let target = resolve(&path, &modules);
            if target == source.module {
                continue;
            }
            if floor(&target) > here {
                broken.push(format!(
                    "{} (floor {here}) uses {} (floor {})",
                    source.module.join("::"),
                    target.join("::"),
                    floor(&target)
                ));
            }
            if here == 0 && !target.is_empty() && target != source.module {
                broken.push(format!(
                    "{} is a leaf, yet uses {}",
                    source.module.join("::"),
                    target.join("::")
                ));
            }
            // A directory's module (its mod.rs) declares and re-exports its rooms; any other
            // use of a child from its parent would make them lean on each other.
            if source.is_mod_rs && target.starts_with(&source.module) && !reexport {
                let declared = source
                    .text
                    .contains(&format!("mod {};", target[source.module.len()]));
                let only_declared = path.len() == source.module.len() + 1 && declared;
                if !only_declared {
                    broken.push(format!(
                        "{} uses its own room {} (a directory's module only declares and re-exports)",
                        source.module.join("::"),
                        target.join("::")
                    ));
                }
            }
            let (from_parent, to_parent) = (parent(&source.module), parent(&target));
            if from_parent == to_parent && !source.module.is_empty() && !target.is_empty() {
                siblings.entry(from_parent).or_default().insert((
                    source.module.last().unwrap().clone(),
                    target.last().unwrap().clone(),
                ));
            }
        }
        if here < 4 {
            for krate in WEB_CRATES {
                let named = source.text.lines().any(|line| {
                    let line = line.trim();
                    line.starts_with(&format!("use {krate}::"))
                        || line.contains(&format!(" {krate}::"))
                        || line.contains(&format!("({krate}::"))
                        || line.contains(&format!("#[{krate}::"))
                });
                if named {
                    broken.push(format!(
                        "{} (floor {here}) names {krate}: only the HTTP floor may",
                        source.module.join("::")
                    ));
                }
            }
        }
    }
    for (room, edges) in &siblings {
        if let Some(circle) = a_circle(edges) {
            broken.push(format!(
                "in {}: {}",
                if room.is_empty() {
                    "the crate root".into()
                } else {
                    room.join("::")
                },
                circle.join(" → ")
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "the house rules are broken:\n{}",
        broken.join("\n")
    );
}

/// A circle among these edges, if there is one.
fn a_circle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    fn visit<'a>(
        node: &'a String,
        edges: &'a BTreeSet<(String, String)>,
        path: &mut Vec<&'a String>,
        done: &mut BTreeSet<&'a String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut circle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
            circle.push(node.clone());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node);
        for (_, next) in edges.iter().filter(|(from, _)| from == node) {
            if let Some(circle) = visit(next, edges, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    nodes
        .into_iter()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

/// The rules catch what they are meant to: an upward use, a circle.
#[test]
fn the_rules_see_an_upward_use_and_a_circle() {
    let store_keys = Source {
        module: vec!["store".into(), "keys".into()],
        is_mod_rs: false,
        text: "use crate::api::keyed_requests::KeyOutcome;\nuse super::{Store, row::Arg};".into(),
    };
    let found: Vec<Vec<String>> = references(&store_keys)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert!(found.contains(&vec!["api".into(), "keyed_requests".into()]));
    assert!(found.contains(&vec!["store".into(), "row".into()]));
    assert_eq!(floor(&found[0]), 4);
    let edges: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(x, y)| (x.to_string(), y.to_string()))
        .collect();
    assert_eq!(a_circle(&edges).unwrap(), ["a", "b", "c", "a"]);
}
