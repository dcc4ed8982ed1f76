//! Opens an engine in a fresh directory, as a program that depends on cairn-engine does: puts,
//! gets, watches its own writes, and reopens the directory to find them. Exits non-zero,
//! saying why, when anything differs.

use cairn_engine::{Config, Engine, EventKind, WatchRequest, WatchResponse};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("cairn-outside-{}", std::process::id()));
    let engine = Engine::open(&dir, Config::default())?;
    let watch = engine.watch(&WatchRequest::prefix("greetings/"))?;
    let revision = engine.put("greetings/en", "hello")?;
    engine.put("greetings/fr", "bonjour")?;
    let kv = engine.get("greetings/en")?.ok_or("greetings/en is missing")?;
    if kv.value.as_ref() != b"hello" || kv.mod_revision != revision {
        return Err(format!("get: {kv:?}, after a put at revision {revision}").into());
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match watch.recv_timeout(Duration::from_secs(30)) {
            Some(WatchResponse::Events { events, .. }) => {
                for e in events.iter() {
                    if e.kind == EventKind::Put {
                        seen.push(String::from_utf8_lossy(&e.kv.key).into_owned());
                    }
                }
            }
            Some(_) => {}
            None => return Err(format!("the watch saw {seen:?}, then nothing").into()),
        }
    }
    if seen != ["greetings/en", "greetings/fr"] {
        return Err(format!("the watch saw {seen:?}").into());
    }
    engine.close()?;
    let engine = Engine::open(&dir, Config::default())?;
    let kept = engine.get_prefix("greetings/")?.len();
    engine.close()?;
    std::fs::remove_dir_all(&dir)?;
    if kept != 2 {
        return Err(format!("{kept} greetings after reopening, not 2").into());
    }
    println!("cairn-engine from its package: put, get, watch and reopen as expected");
    Ok(())
}
