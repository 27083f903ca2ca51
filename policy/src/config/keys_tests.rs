//! The key table against the page it renders and the parser it describes.

use std::collections::BTreeSet;
use std::path::Path;

use super::*;
use crate::config::parse;

/// `docs/operating.md`, from this crate's directory.
fn guide_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operating.md")
}

/// The rendered part of the page: from the first section heading to the next `## `.
fn rendered_part(page: &str) -> Option<(usize, usize)> {
    let start = page.find("#### `[listen]`")?;
    let end = start + page[start..].find("\n## ")? + 1;
    Some((start, end))
}

#[test]
fn the_reference_in_the_operator_guide_is_the_rendered_table() {
    let path = guide_path();
    let page = std::fs::read_to_string(&path).unwrap();
    let (start, end) = rendered_part(&page).expect("the config reference in docs/operating.md");
    let want = format!("{}\n", reference());
    if std::env::var_os("REGENERATE_DOCS").is_some() {
        let page = format!("{}{want}{}", &page[..start], &page[end..]);
        std::fs::write(&path, page).unwrap();
        return;
    }
    assert!(
        page[start..end] == want,
        "docs/operating.md's config reference differs from policy/src/config/keys.rs; \
         change the table and run REGENERATE_DOCS=1 cargo test -p policy config::keys\n\
         --- rendered ---\n{want}"
    );
}

/// The keys serde names for a section, read from its unknown-field error (the one list
/// of a `deny_unknown_fields` struct's fields the parser exposes).
fn accepted(probe: &str) -> BTreeSet<String> {
    let err = parse(probe, "probe.toml").unwrap_err().to_string();
    let list = err
        .split("expected one of ")
        .nth(1)
        .or_else(|| err.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("no field list in: {err}"));
    list.lines()
        .next()
        .unwrap_or_default()
        .replace(" or ", ", ")
        .split(", ")
        .map(|f| f.trim().trim_matches('`').to_owned())
        .collect()
}

#[test]
fn the_table_lists_exactly_the_keys_the_parser_accepts() {
    let probes = [
        ("[listen]", "[listen]\nzz_unknown = 1\n"),
        ("[resolver]", "[resolver]\nzz_unknown = 1\n"),
        ("[upstream]", "[upstream]\nzz_unknown = 1\n"),
        ("[tls]", "[tls]\nzz_unknown = 1\n"),
        ("[timeouts]", "[timeouts]\nzz_unknown = 1\n"),
        ("[limits]", "[limits]\nzz_unknown = 1\n"),
        ("[log]", "[log]\nzz_unknown = 1\n"),
        ("[telemetry]", "[telemetry]\nzz_unknown = 1\n"),
        ("[global]", "[global]\nzz_unknown = 1\n"),
        ("[registry]", "[registry]\nzz_unknown = 1\n"),
        (
            "[[authority]]",
            "[[authority]]\nname = \"a\"\nzz_unknown = 1\n",
        ),
        (
            "[[authority.request_rule]]",
            "[[authority]]\nname = \"a\"\n[[authority.request_rule]]\nzz_unknown = 1\n",
        ),
        (
            "[[authority.credential]]",
            "[[authority]]\nname = \"a\"\n[[authority.credential]]\nzz_unknown = 1\n",
        ),
    ];
    let headings: Vec<&str> = SECTIONS.iter().map(|s| s.heading).collect();
    let probed: Vec<&str> = probes.iter().map(|(h, _)| *h).collect();
    assert_eq!(
        headings, probed,
        "every section of the table is probed, in order"
    );
    for (heading, probe) in probes {
        let section = SECTIONS.iter().find(|s| s.heading == heading).unwrap();
        let listed: BTreeSet<String> = section.keys.iter().map(|k| k.key.to_owned()).collect();
        assert_eq!(listed, accepted(probe), "{heading}");
    }
    // Every top-level table has its section.
    let tops = accepted("[zz_not_a_section]\n");
    for top in tops {
        let heading = if top == "authority" {
            "[[authority]]".to_owned()
        } else {
            format!("[{top}]")
        };
        assert!(
            headings.contains(&heading.as_str()),
            "{heading} has no section"
        );
    }
}

#[test]
fn checked_defaults_are_what_an_empty_config_yields() {
    let empty = parse("", "empty.toml").unwrap();
    let mut checked = 0;
    for section in SECTIONS {
        for key in section.keys {
            let Some(check) = key.check else { continue };
            let shown = key
                .default
                .split('`')
                .nth(1)
                .unwrap_or_else(|| panic!("{}: no code span in {:?}", key.key, key.default));
            assert_eq!(check(&empty), shown, "{} {}", section.heading, key.key);
            checked += 1;
        }
    }
    assert!(checked >= 23, "{checked} defaults checked");
}
