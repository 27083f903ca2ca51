//! Unit tests of `control`.

use super::*;

#[test]
fn fingerprints_see_table_and_global_changes_only() {
    let a = fingerprints(
        "[listen]\ntcp = \"127.0.0.1:1\"\n[[authority]]\nname = \"a\"\nallow = [\"x.test\"]\n[[authority]]\nname = \"b\"\n",
    );
    let same = fingerprints(
        "[listen]\ntcp = \"127.0.0.1:1\"\n\n[[authority]]\nallow = [ \"x.test\" ]\nname = \"a\"\n[[authority]]\nname = \"b\"\n",
    );
    assert_eq!(a.authorities, same.authorities);
    assert_eq!(a.sections, same.sections);
    let changed = fingerprints(
        "[listen]\ntcp = \"127.0.0.1:2\"\n[[authority]]\nname = \"a\"\nallow = [\"y.test\"]\n[[authority]]\nname = \"b\"\n",
    );
    assert_ne!(a.authorities["a"], changed.authorities["a"]);
    assert_eq!(a.authorities["b"], changed.authorities["b"]);
    assert_ne!(a.sections["listen"], changed.sections["listen"]);
    let global = fingerprints(
        "[listen]\ntcp = \"127.0.0.1:1\"\n[global]\ndeny = [\"*:25\"]\n[[authority]]\nname = \"a\"\nallow = [\"x.test\"]\n[[authority]]\nname = \"b\"\n",
    );
    assert_ne!(a.authorities["b"], global.authorities["b"]);
}
