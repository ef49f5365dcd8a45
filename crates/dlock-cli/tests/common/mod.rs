//! Helpers shared by the CLI test binaries: running `dlock`, and a holder
//! whose command logs its fence and node and waits to be let go.

use std::io::Write;
use std::process::{Child, Command, Stdio};

/// The `dlock` binary under test, with `DLOCK_ENDPOINT` set.
pub fn dlock_on(endpoint: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env("DLOCK_ENDPOINT", endpoint);
    c
}

/// A running `dlock ... -- sh -c CMD` whose command logs `TAG FENCE NODE`
/// once inside and then holds until [`finish`](Self::finish)ed (a line on
/// its standard input, which the command inherits from dlock).
pub struct Holder(pub Child);

impl Holder {
    pub fn start(endpoint: &str, args: &[&str], log: &std::path::Path, tag: &str) -> Holder {
        Holder(
            dlock_on(endpoint)
                .args(args)
                .args(["--", "sh", "-c"])
                .arg(format!(
                    "echo {tag} $DLOCK_FENCE $DLOCK_NODE >> {}; read line",
                    log.display()
                ))
                .stdin(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    /// Lets the command end; dlock's exit code.
    pub fn finish(mut self) -> Option<i32> {
        let mut stdin = self.0.stdin.take().unwrap();
        writeln!(stdin, "done").unwrap();
        drop(stdin);
        self.0.wait().unwrap().code()
    }
}

/// The log line of `tag`'s command: `[tag, fence, node]`.
pub fn logged(log: &std::path::Path, tag: &str) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(tag))
        .unwrap_or_else(|| panic!("{tag} never ran: {text}"));
    line.split_whitespace().map(String::from).collect()
}
