//! A counter that survives restarts: each run increments it with a compare-and-swap Txn.
//!
//! ```sh
//! cargo run -p cairn-engine --example counter      # prints 1, then 2 on the next run, ...
//! cargo run -p cairn-engine --example counter -- /tmp/my-counter.cairn
//! ```

use cairn_engine::{Compare, Config, Engine, PutRequest, TxnRequest};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "counter.cairn".to_string());
    let engine = Engine::open(&dir, Config::default())?;
    loop {
        let (value, revision) = match engine.get("counter")? {
            Some(kv) => (std::str::from_utf8(&kv.value)?.parse::<u64>()?, kv.mod_revision),
            None => (0, 0),
        };
        // Only write if nobody changed the counter since we read it.
        let txn = TxnRequest::when([Compare::mod_revision("counter").eq(revision)])
            .then([PutRequest::new("counter", (value + 1).to_string())]);
        let applied = engine.txn(txn)?;
        if applied.response.succeeded {
            println!("counter = {} (revision {}, data in {dir})", value + 1, applied.revision);
            break;
        }
    }
    engine.close()?;
    Ok(())
}
