//! Three members of one replicated group in one process, over the in-process
//! [`LocalNetwork`]: a write through any member is applied by all, reads are linearizable
//! anywhere, and the group survives restarts (each member keeps its own data directory).
//!
//! ```sh
//! cargo run -p cairn-engine --example cluster                 # writes "greeting" at run 1, 2, ...
//! cargo run -p cairn-engine --example cluster -- /tmp/my-cluster
//! ```

use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_engine::{Engine, LocalNetwork, PutRequest, RangeRequest};

const MEMBERS: [u64; 3] = [1, 2, 3];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::args().nth(1).unwrap_or_else(|| "cluster.cairn".to_string());
    let net = LocalNetwork::new(7);
    let mut members = Vec::new();
    for id in MEMBERS {
        let engine = Engine::builder(format!("{root}/member-{id}"))
            .member(id)
            .peers(MEMBERS)
            .transport(net.transport(id))
            .open()?;
        net.attach(id, engine.inbox()?);
        members.push(engine);
    }

    // Any member takes writes: a follower forwards them to the leader. Until the first
    // election is over there is no leader to forward to.
    let via = members.last().ok_or("no members")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let runs = loop {
        let previous = via.range(&RangeRequest::key("runs"));
        let runs = match previous {
            Ok(r) => match r.kvs.first() {
                Some(kv) => String::from_utf8_lossy(&kv.value).parse::<u64>()? + 1,
                None => 1,
            },
            Err(e) if e.is_transient() && Instant::now() < deadline => continue,
            Err(e) => return Err(e.into()),
        };
        let put = PutRequest {
            key: b"runs".to_vec(),
            value: Bytes::from(runs.to_string()),
            ..PutRequest::default()
        };
        match via.write(put) {
            Ok(_) => break runs,
            Err(e) if e.is_transient() && Instant::now() < deadline => continue,
            Err(e) => return Err(e.into()),
        }
    };
    for engine in &members {
        // Linearizable reads: each member sees the write, whoever took it.
        let read = engine.range(&RangeRequest::key("runs"))?;
        let value = read
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        println!(
            "member {} (leader {:?}): runs = {}",
            engine.member_id(),
            engine.leader(),
            value.unwrap_or_default()
        );
    }
    println!("run {runs} done; run me again to see the group carry on");
    for engine in members {
        engine.close()?;
    }
    Ok(())
}
