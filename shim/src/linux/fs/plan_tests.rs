use super::*;
use crate::testing::TempDir;

#[test]
fn plan_orders_ops_shallowest_first_and_pins_git() {
    let t = TempDir::new("fs-order");
    let w = t.tree(
        "w",
        &[
            (".git/hooks/", ""),
            (".git/config", ""),
            ("sub/inner/.git/", ""),
            ("target/x/.git/", ""),
            ("target/CACHEDIR.TAG", ""),
        ],
    );
    let mut plan = FsPlan::default();
    super::plan(
        std::slice::from_ref(&w),
        &[w.join("secret"), t.0.join("missing")],
        &[],
        &[],
        (None, false),
        &mut plan,
    )
    .unwrap();
    let depths: Vec<usize> = plan.ops.iter().map(|o| depth(&o.path)).collect();
    assert!(depths.windows(2).all(|d| d[0] <= d[1]), "{:?}", plan.ops);
    assert_eq!(
        plan.ops[0],
        MountOp {
            path: w.clone(),
            kind: OpKind::Writable,
            is_dir: true
        }
    );
    assert!(plan.ops.contains(&MountOp {
        path: w.join(".git"),
        kind: OpKind::Pin,
        is_dir: true
    }));
    assert!(plan.ops.contains(&MountOp {
        path: w.join(".git/hooks"),
        kind: OpKind::Protect,
        is_dir: true
    }));
    assert!(
        plan.ops.contains(&MountOp {
            path: w.join("sub/inner/.git"),
            kind: OpKind::Pin,
            is_dir: true
        }),
        "nested repo"
    );
    assert!(
        !plan
            .ops
            .iter()
            .any(|o| o.path.starts_with(w.join("target"))),
        "CACHEDIR.TAG pruned"
    );
    // Missing project files got placeholders; home files did not (not a home dir).
    assert!(
        plan.placeholders
            .iter()
            .any(|p| p.path == w.join(".mcp.json"))
    );
    assert!(
        !plan
            .placeholders
            .iter()
            .any(|p| p.path == w.join(".bashrc"))
    );
    for p in &plan.placeholders {
        p.remove();
        assert!(!p.path.exists(), "{}", p.path.display());
    }
}

#[test]
fn a_strangers_plan_masks_the_closed_directories_on_the_way() {
    use std::os::unix::fs::PermissionsExt;
    let t = TempDir::new("fs-closed");
    let (closed, open) = (t.0.join("closed"), t.0.join("open"));
    for d in [
        closed.join("w"),
        closed.join("deeper/secret"),
        open.join("w"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let masks = |stranger: bool| {
        let mut plan = FsPlan::default();
        super::plan(
            &[closed.join("w"), open.join("w")],
            &[closed.join("deeper/secret")],
            &[],
            &[],
            (None, stranger),
            &mut plan,
        )
        .unwrap();
        plan.placeholders.iter().for_each(Placeholder::remove);
        plan.ops
            .into_iter()
            .filter(|o| o.kind == OpKind::Mask)
            .map(|o| o.path)
            .collect::<Vec<_>>()
    };
    // Once, shallowest first, with the user's own mask inside it.
    assert_eq!(masks(true), [closed.clone(), closed.join("deeper/secret")]);
    assert_eq!(masks(false), [closed.join("deeper/secret")]);
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_strangers_allow_read_is_an_idmapped_copy_with_the_way_held_open() {
    use std::os::unix::fs::PermissionsExt;
    let t = TempDir::new("fs-grant");
    let (closed, open, w) = (t.0.join("closed"), t.0.join("open"), t.0.join("w"));
    let private = open.join("private");
    for d in [
        closed.join("tool"),
        open.join("x"),
        private.clone(),
        w.join("sub"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    for d in [&closed, &private] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let planned = |stranger: bool| {
        let mut plan = FsPlan::default();
        super::plan(
            std::slice::from_ref(&w),
            &[],
            &[
                closed.join("tool"),
                open.join("x"),
                private.clone(),
                w.join("sub"),
                "/".into(),
            ],
            &[],
            (None, stranger),
            &mut plan,
        )
        .unwrap();
        plan.placeholders.iter().for_each(Placeholder::remove);
        plan
    };
    let of = |plan: &FsPlan, kind: OpKind| {
        plan.ops
            .iter()
            .filter(|o| o.kind == kind)
            .map(|o| o.path.clone())
            .collect::<Vec<_>>()
    };
    // Root's command: a copy of each it could not read as it is (beneath a closed
    // directory, closed itself), and the closed directory on the way masked; what
    // others may read, and what a writable root holds, stay as they are.
    let p = planned(true);
    assert_eq!(p.read_grants, [closed.join("tool"), private.clone()]);
    assert_eq!(
        of(&p, OpKind::Readable),
        [closed.join("tool"), private.clone()]
    );
    assert_eq!(of(&p, OpKind::Mask), std::slice::from_ref(&closed));
    // The caller's command reads them as they are.
    let p = planned(false);
    assert!(p.read_grants.is_empty() && p.ops.iter().all(|o| o.kind != OpKind::Readable));
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn op(path: &str, kind: OpKind) -> MountOp {
    MountOp {
        path: path.into(),
        kind,
        is_dir: true,
    }
}

#[test]
fn order_is_shallowest_first_then_by_kind_and_drops_repeats() {
    let ordered = order(vec![
        op("/w/.git/hooks", OpKind::Protect),
        op("/w/.git", OpKind::Pin),
        op("/w/secret", OpKind::Mask),
        op("/w", OpKind::Mask),
        op("/w", OpKind::Writable),
        op("/w/.git", OpKind::Pin),
        op("/w/secret/open", OpKind::Readable),
    ]);
    assert_eq!(
        ordered,
        vec![
            // A mask at a writable root's own path covers it: applied after it.
            op("/w", OpKind::Writable),
            op("/w", OpKind::Mask),
            op("/w/secret", OpKind::Mask),
            op("/w/.git", OpKind::Pin),
            op("/w/secret/open", OpKind::Readable),
            op("/w/.git/hooks", OpKind::Protect),
        ]
    );
}

#[test]
fn allow_write_root_is_refused() {
    let mut plan = FsPlan::default();
    assert!(matches!(
        super::plan(&["/".into()], &[], &[], &[], (None, false), &mut plan),
        Err(Error::Usage(_))
    ));
}

#[test]
fn missing_allow_write_is_an_error_missing_deny_is_not() {
    let mut plan = FsPlan::default();
    assert!(matches!(
        super::plan(
            &["/nonexistent-shim-test".into()],
            &[],
            &[],
            &[],
            (None, false),
            &mut plan
        ),
        Err(Error::Path { .. })
    ));
    let mut plan = FsPlan::default();
    super::plan(
        &[],
        &["/nonexistent-shim-test".into()],
        &[],
        &[],
        (None, false),
        &mut plan,
    )
    .unwrap();
    assert!(plan.ops.is_empty());
}
