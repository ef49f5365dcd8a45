//! The multi-lock of the design documents: a re-entrant lock and a
//! non-reentrant one taken together, all or nothing.
//!
//!     cargo run --example multi_lock [-- --endpoint zk://127.0.0.1:2181]

mod common;
use common::endpoint;

use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = endpoint();
    let root = format!("/examples/multi-{}", uuid::Uuid::new_v4().simple());
    let (a, b) = (
        dlock::connect(&endpoint).await?,
        dlock::connect(&endpoint).await?,
    );
    let both = |s: &dlock::Session| -> dlock::Result<dlock::MultiLock> {
        Ok(dlock::MultiLock::new(vec![
            Box::new(dlock::Mutex::new(s, &format!("{root}/reentrant"))?),
            Box::new(dlock::SemaphoreMutex::new(
                s,
                &format!("{root}/non-reentrant"),
            )?),
        ]))
    };
    let held = both(&a)?.acquire().await?;
    println!("client a holds both locks, tokens {:?}", held.tokens());
    let err = both(&b)?
        .acquire_timeout(Duration::from_millis(200))
        .await
        .expect_err("b must wait");
    println!("client b: {err}");
    held.release().await?;
    let held = both(&b)?.acquire().await?;
    println!("client b holds both locks after a released them");
    held.release().await?;
    Ok(())
}
