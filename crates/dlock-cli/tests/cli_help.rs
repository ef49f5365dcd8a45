//! `dlock --help` as a user meets it: every subcommand, at every depth,
//! shows an example, and the exit-code table is the one README.md shows.

use std::collections::BTreeMap;
use std::process::Command;

/// `dlock ARGS... --help`, which must succeed; its text.
fn help(args: &[&str]) -> String {
    help_with(args, None)
}

/// [`help`], with `DLOCK_ENDPOINT` set to `endpoint` if given.
fn help_with(args: &[&str], endpoint: Option<&str>) -> String {
    let mut dlock = Command::new(env!("CARGO_BIN_EXE_dlock"));
    dlock.args(args).arg("--help");
    match endpoint {
        Some(endpoint) => dlock.env("DLOCK_ENDPOINT", endpoint),
        None => dlock.env_remove("DLOCK_ENDPOINT"),
    };
    let out = dlock.output().expect("run dlock");
    assert!(out.status.success(), "dlock {args:?} --help failed");
    assert!(
        out.stderr.is_empty(),
        "dlock {args:?} --help wrote to stderr"
    );
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The subcommands a help text lists (its `Commands:` section), but `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        // A name starts its line after two spaces; deeper indents continue
        // the line above.
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Walks every subcommand, depth first, from `path`.
fn walk(path: Vec<String>, seen: &mut Vec<(Vec<String>, String)>) {
    walk_with(path, None, seen)
}

/// [`walk`], with `DLOCK_ENDPOINT` set to `endpoint` if given.
fn walk_with(path: Vec<String>, endpoint: Option<&str>, seen: &mut Vec<(Vec<String>, String)>) {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = help_with(&args, endpoint);
    for sub in subcommands(&text) {
        let mut deeper = path.clone();
        deeper.push(sub);
        walk_with(deeper, endpoint, seen);
    }
    seen.push((path, text));
}

/// An endpoint exported as `DLOCK_ENDPOINT`, as the README suggests, never
/// shows in any `--help`: before, clap printed the variable's value, a
/// password or a Consul token with it.
#[test]
fn no_help_shows_the_endpoints_credentials() {
    let endpoints = [
        "etcd://root:hunter2secret@127.0.0.1:2379",
        "consul://127.0.0.1:8500?token=tok3n5ecret",
    ];
    for endpoint in endpoints {
        let mut seen = Vec::new();
        walk_with(Vec::new(), Some(endpoint), &mut seen);
        assert!(seen.len() > 10, "the walk found {} helps", seen.len());
        for (path, text) in seen {
            for secret in ["hunter2secret", "tok3n5ecret"] {
                assert!(
                    !text.contains(secret),
                    "dlock {} --help shows {secret}",
                    path.join(" ")
                );
            }
        }
    }
}

/// Each subcommand's `--help` (and every nested one's, such as `count get`
/// or `demo leader`) has an example: a line starting `Example`, with a
/// `dlock` command line that names the subcommand.
#[test]
fn every_subcommand_help_shows_an_example() {
    let mut seen = Vec::new();
    walk(Vec::new(), &mut seen);
    let subcommands: Vec<_> = seen.iter().filter(|(path, _)| !path.is_empty()).collect();
    // The known ones at least (new ones are found by the walk).
    for known in [
        "lock",
        "read-lock",
        "write-lock",
        "semaphore",
        "elect",
        "count",
        "barrier",
        "double-barrier",
        "inspect",
        "revoke",
        "bench",
        "demo",
    ] {
        assert!(
            subcommands.iter().any(|(p, _)| p == &[known]),
            "dlock --help does not list {known}"
        );
    }
    let mut missing = Vec::new();
    for (path, text) in subcommands {
        let name = path.join(" ");
        let example = text
            .lines()
            .map(str::trim)
            .skip_while(|l| !l.starts_with("Example"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        if !example.contains(&format!("dlock {name}")) && !example.contains(&format!(" {name} ")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "no example line in the --help of: {missing:?}"
    );
}

/// Rows `code → meaning` of a table: `  CODE  MEANING` lines after `Exit
/// codes:` in the help, `| CODE | MEANING |` rows in README.md.
fn help_rows(help: &str) -> BTreeMap<String, String> {
    help.lines()
        .skip_while(|l| l.trim() != "Exit codes:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            let (code, meaning) = l.trim().split_once(' ').expect("code and meaning");
            (code.to_string(), meaning.trim().to_string())
        })
        .collect()
}

fn readme_rows(readme: &str) -> BTreeMap<String, String> {
    readme
        .lines()
        .skip_while(|l| !l.starts_with("| code | meaning |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 2, "{l}");
            (cells[0].to_string(), cells[1].to_string())
        })
        .collect()
}

/// `dlock --help` ends with the exit-code table (made from `src/exit.rs`,
/// whose unit test checks it names every code), and README.md shows the
/// same rows.
#[test]
fn the_exit_code_table_is_the_same_in_help_and_readme() {
    let from_help = help_rows(&help(&[]));
    for code in ["0", "64", "65", "66", "67", "70", "126", "127"] {
        assert!(
            from_help.contains_key(code),
            "no exit code {code}: {from_help:?}"
        );
    }
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    assert_eq!(readme_rows(&readme), from_help);
}
