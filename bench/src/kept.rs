//! BENCHMARKS.md's sections that runs of their own write (`checkout-bench --receipts N`,
//! `--dashboard N`, `widget-load`): each run writes its file, and BENCHMARKS.md keeps what the
//! last full run wrote, then every such section from its file, in one order.

use std::fmt::Write as _;

/// A section kept from a run of its own: its heading in BENCHMARKS.md and the file its run
/// writes.
struct Kept {
    heading: &'static str,
    file: &'static str,
}

const KEPT: [Kept; 3] = [
    Kept {
        heading: "## Fiscal receipts: what the consumer's inbox costs, and the lag",
        file: "bench/receipts.md",
    },
    Kept {
        heading: "## The shop's dashboard at 100 000 payments",
        file: "bench/dashboard.md",
    },
    Kept {
        heading: "## The widget's load: in its frame against in the shop's page",
        file: "bench/widget-load.md",
    },
];

/// Appends every kept section whose file exists. A file's own title (a first line `# …`) gives
/// way to the section's heading, and its headings go one level down.
pub fn append(md: &mut String) {
    for kept in KEPT {
        let Ok(text) = std::fs::read_to_string(kept.file) else {
            continue;
        };
        let body = text.strip_prefix("# ").map_or(text.as_str(), |titled| {
            titled.split_once('\n').map_or("", |(_, rest)| rest)
        });
        let body = format!("\n{}", body.trim()).replace("\n## ", "\n### ");
        writeln!(md, "\n{}\n{body}", kept.heading).unwrap();
    }
}

/// Writes `out` (BENCHMARKS.md) anew: what the last full run wrote, kept, then every kept
/// section from its file.
pub fn rewrite(out: &str) {
    let written = std::fs::read_to_string(out).unwrap_or_default();
    let ends = KEPT
        .iter()
        .filter_map(|kept| written.find(kept.heading))
        .min()
        .unwrap_or(written.len());
    let mut md = written[..ends].trim_end().to_owned() + "\n";
    append(&mut md);
    std::fs::write(out, md).unwrap();
}
