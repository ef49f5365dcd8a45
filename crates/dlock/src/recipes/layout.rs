//! [`Layout`]: whose node layout a recipe writes, for recipes that can
//! share their nodes with another implementation.
//!
//! # Consul's layouts (a compatibility contract)
//!
//! With [`Layout::Consul`], dlock writes what Consul's own `api.Lock` and
//! `api.Semaphore` (so `consul lock [-n N]`) write, so that both kinds of
//! clients on one prefix exclude each other:
//! - **Lock** ([`ConsulLock`](super::consul_lock::ConsulLock)): one key
//!   `<prefix>/.lock`, acquired by the holder's session, tagged
//!   [`CONSUL_LOCK_FLAGS`].
//! - **Semaphore** ([`KvSemaphore`](super::kv_semaphore::KvSemaphore)):
//!   contender keys `<prefix>/<session UUID>` acquired by their session, and
//!   the record `<prefix>/.lock` = `{"Limit":N,"Holders":{"<UUID>":true}}`,
//!   all tagged [`CONSUL_SEMAPHORE_FLAGS`], the record updated by
//!   compare-and-set.
//!
//! Consul's tools refuse keys without their flag values
//! (`ErrLockConflict`, `ErrSemaphoreConflict`), so these nodes are created
//! with [tags](crate::store::CreateOptions::with_tag); the store keeps the
//! data version elsewhere for them (see `store::consul`).
//!
//! On the other backends the same layout is written (tags dropped), so a
//! recipe behaves alike everywhere; only on Consul does it meet Consul's
//! tools.

use std::fmt;
use std::str::FromStr;

/// The `Flags` of the key of Consul's `api.Lock` (`consul lock <prefix>`).
pub const CONSUL_LOCK_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

/// The `Flags` of every key of Consul's `api.Semaphore` (`consul lock -n N`).
pub const CONSUL_SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

/// Whose node layout a recipe uses.
///
/// ```
/// use dlock::Layout;
/// assert_eq!("consul".parse::<Layout>().unwrap(), Layout::Consul);
/// assert_eq!(Layout::default(), Layout::Curator);
/// assert_eq!(Layout::Consul.to_string(), "consul");
/// assert!("zookeeper".parse::<Layout>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// dlock's own layouts: Curator's for the Curator recipes, and for the
    /// [`KvSemaphore`](super::kv_semaphore::KvSemaphore), which Curator
    /// lacks, dlock's record `{"limit":N,"holders":[...]}`.
    #[default]
    Curator,
    /// Consul's `api.Lock` and `api.Semaphore` layouts (see the [module
    /// docs](self)).
    Consul,
}

/// A layout name that is none of `curator`, `consul`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown layout {0:?}: expected \"curator\" or \"consul\"")]
pub struct UnknownLayout(pub String);

impl FromStr for Layout {
    type Err = UnknownLayout;

    fn from_str(s: &str) -> Result<Self, UnknownLayout> {
        match s {
            "curator" => Ok(Layout::Curator),
            "consul" => Ok(Layout::Consul),
            other => Err(UnknownLayout(other.to_string())),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Curator => "curator",
            Layout::Consul => "consul",
        })
    }
}
