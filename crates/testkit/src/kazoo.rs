//! kazoo 2.8 (Python) in a child process, driven by line commands: the
//! other side of the kazoo interoperability tests (see
//! `python/kazoo_probe.py` for the commands). Uses Debian's `python3-kazoo`.

use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::line_probe::LineProbe;

/// The probe's source, run in place.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/kazoo_probe.py");

/// The Python that has kazoo: `$DLOCK_PYTHON`, else Debian's
/// `/usr/bin/python3` (where `python3-kazoo` installs; a `python3` earlier
/// on `PATH`, such as pyenv's, may lack it).
pub fn python() -> String {
    std::env::var("DLOCK_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_string())
}

/// A Python process running kazoo, answering one line per command
/// ([`LineProbe`]'s `next_line`, `send`, `ask`).
pub struct KazooProbe(LineProbe);

impl KazooProbe {
    /// Starts the probe against `connect` (`host:port[,...]`) and waits
    /// until kazoo is connected.
    pub fn start(connect: &str) -> Result<KazooProbe> {
        let installed = Command::new(python())
            .args(["-c", "import kazoo.recipe.lock"])
            .status()
            .with_context(|| format!("{} must be installed", python()))?;
        ensure!(
            installed.success(),
            "kazoo is missing from {}: install it with scripts/test.sh (apt-get install python3-kazoo), or name a Python that has it in DLOCK_PYTHON",
            python()
        );
        let mut command = Command::new(python());
        command.args(["-u", SCRIPT, connect]);
        // kazoo quits cleanly (closing its session) when not stuck.
        LineProbe::start("kazoo", Duration::from_secs(10), command).map(KazooProbe)
    }
}

crate::line_probe::drives_through_line_probe!(KazooProbe);
