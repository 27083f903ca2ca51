//! The sandbox's filesystem view, built in its own mount namespace, in three steps of one
//! job each:
//!
//! - [`protect`]: the mandatory deny set found in every writable root (including nested
//!   repositories), with placeholders for protected paths that do not exist yet, or a
//!   watch where a placeholder would not do; [`repos`] finds the repositories nested
//!   in a root;
//! - [`quarantine`](mod@quarantine), after the run: what appeared at a watched path (a
//!   `.git/commondir`, a shell startup file in a writable root that is not the home
//!   directory) is renamed aside;
//! - [`plan`](mod@plan), in the outer shim, in the host's view: canonicalises the configured paths
//!   and lists the mount operations, shallowest first;
//! - [`apply`](mod@apply), in the inner init, inside the new mount namespace: carries them out;
//! - [`tmp`]: the private temporary directory at `/tmp` and `/var/tmp`, planned with the
//!   rest and mounted by [`apply`](mod@apply).
//!
//! It must never leave the host's mount table changed: everything happens after
//! `MS_PRIVATE` in a namespace that dies with the sandbox. The only host-visible effect is
//! the placeholders (empty files or directories) created for protected paths that do not
//! exist yet, which the outer shim (or its janitor, if the shim is killed) removes.

mod apply;
mod plan;
mod protect;
mod quarantine;
mod repos;
pub(crate) mod tmp;

pub(crate) use apply::{apply, cover_file, detached_copies};
pub(crate) use plan::{FsPlan, OpKind, plan};
pub(crate) use protect::Placeholder;
pub(crate) use quarantine::{Watch, quarantine};
