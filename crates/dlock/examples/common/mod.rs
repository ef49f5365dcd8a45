//! What every example shares: where to connect.

/// The `--endpoint URL` argument, or the embedded store.
pub fn endpoint() -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--endpoint")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "embedded".into())
}
