//! A prefix watch consumed as an async stream: a writer thread queues jobs under `jobs/`, and an
//! async task prints each change as it is applied.
//!
//! ```sh
//! cargo run -p cairn-engine --example watch_stream
//! ```

use cairn_engine::{Config, Engine, EventKind, WatchRequest, WatchResponse};
use tokio_stream::StreamExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let engine = std::sync::Arc::new(Engine::open(dir.path(), Config::default())?);
    let mut watch = engine.watch(&WatchRequest::prefix("jobs/"))?;

    let writer = engine.clone();
    std::thread::spawn(move || -> cairn_engine::Result<()> {
        for job in ["build", "test", "deploy"] {
            writer.put(format!("jobs/{job}"), "queued")?;
        }
        writer.delete("jobs/test")?;
        Ok(())
    });

    let mut seen = 0;
    while let Some(WatchResponse::Events { events, .. }) = watch.next().await {
        for event in events.iter() {
            let key = String::from_utf8_lossy(&event.kv.key);
            match event.kind {
                EventKind::Put => println!("{key} = {}", String::from_utf8_lossy(&event.kv.value)),
                EventKind::Delete => println!("{key} deleted"),
            }
            seen += 1;
        }
        if seen == 4 {
            break;
        }
    }
    Ok(())
}
