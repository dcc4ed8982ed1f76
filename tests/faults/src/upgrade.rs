//! A rolling upgrade under faults (`--upgrade-from`), and a downgrade back (`--downgrade`): the
//! members start on the older build and are swapped for `--binary` one at a time (the leader
//! first, then followers, so that the last is the leader when it still runs the old build),
//! while the nemesis goes on between the swaps. With `--downgrade`, once every member
//! runs the new build and the cluster version has risen, the downgrade is enabled (etcd 3.6's
//! Maintenance.Downgrade) and, once the cluster version is down, the members are swapped back
//! one at a time, the leader last. The run's usual checks then cover the whole of it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_server::pb::etcdserverpb::downgrade_request::DowngradeAction;
use cairn_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use cairn_server::pb::etcdserverpb::{DowngradeRequest, StatusRequest};
use tonic::transport::Channel;

use crate::cluster::{http_get, Cluster};

/// How long the members get to agree a cluster version, faults healed in between.
const AGREEMENT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Swap one member for the new build.
    Upgrade,
    /// Enable the downgrade, and wait until the cluster version is down to its target.
    EnableDowngrade,
    /// Swap one member back for the old build.
    Downgrade,
}

/// The steps, each due at its time, and what was done.
#[derive(Debug)]
pub struct Plan {
    steps: Vec<(Instant, Step)>,
    old: PathBuf,
    new: PathBuf,
    /// The old build's release line, the downgrade's target.
    target: String,
    /// Which build each member runs: true for the new one.
    on_new: Vec<bool>,
    /// What was done, for the report.
    pub log: Vec<String>,
    started: Instant,
}

/// The release line `binary --version` names (`cairn 0.1.0`, or `cairn Version: 0.1.0` when
/// run as `etcd`, → `0.1`).
fn release_line(binary: &Path) -> Result<String, String> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("cairn Version: ").or_else(|| l.strip_prefix("cairn ")))
        .ok_or_else(|| format!("{} --version names no cairn version: {text}", binary.display()))?;
    let mut parts = version.trim().split(['.', '-']);
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => Ok(format!("{major}.{minor}")),
        _ => Err(format!("not a version: {version}")),
    }
}

/// What a plan swaps the members between: the `old` build they start on and the `new` one,
/// `cycles` times over (each an upgrade, then with `downgrade` the downgrade back).
#[derive(Debug, Clone, Copy)]
pub struct Swaps<'a> {
    pub old: &'a Path,
    pub new: &'a Path,
    pub downgrade: bool,
    pub cycles: usize,
}

impl Plan {
    /// The steps of `swaps` for `members` members, spread evenly over `seconds` from `start`.
    pub fn new(start: Instant, seconds: u64, members: usize, swaps: Swaps<'_>) -> Result<Plan, String> {
        let Swaps {
            old,
            new,
            downgrade,
            cycles,
        } = swaps;
        let mut kinds = Vec::new();
        for _ in 0..cycles.max(1) {
            kinds.extend(vec![Step::Upgrade; members]);
            if downgrade {
                kinds.push(Step::EnableDowngrade);
                kinds.extend(vec![Step::Downgrade; members]);
            }
        }
        let gap = Duration::from_secs(seconds) / u32::try_from(kinds.len() + 1).unwrap_or(u32::MAX);
        let steps = kinds
            .into_iter()
            .zip(1u32..)
            .map(|(step, k)| (start + gap * k, step))
            .collect();
        Ok(Plan {
            steps,
            old: old.to_path_buf(),
            new: new.to_path_buf(),
            target: release_line(old)?,
            on_new: vec![false; members],
            log: Vec::new(),
            started: start,
        })
    }

    /// Whether every step was taken.
    pub fn finished(&self) -> bool {
        self.steps.is_empty()
    }

    /// Takes the next step if it is due.
    pub async fn step_if_due(&mut self, cluster: &mut Cluster, channels: &[Channel]) -> Result<(), String> {
        let Some(&(due, step)) = self.steps.first() else {
            return Ok(());
        };
        if Instant::now() < due {
            return Ok(());
        }
        self.steps.remove(0);
        let leader = crate::nemesis::leader(channels).await;
        let at = self.started.elapsed().as_secs_f64();
        match step {
            Step::Upgrade => {
                // The leader first; then the followers, so that the last one is the leader
                // if it is still on the old build.
                let first = self.on_new.iter().all(|n| !n);
                let i = leader
                    .filter(|l| first && !self.on_new[*l])
                    .or_else(|| (0..self.on_new.len()).find(|i| !self.on_new[*i] && Some(*i) != leader))
                    .or_else(|| self.on_new.iter().position(|n| !n))
                    .ok_or("no member left to upgrade")?;
                cluster.swap(i, &self.new)?;
                self.on_new[i] = true;
                self.log.push(format!("{at:.1} s: m{i} upgraded{}", lead(leader, i)));
            }
            Step::Downgrade => {
                // The followers first, the leader last.
                let i = (0..self.on_new.len())
                    .find(|i| self.on_new[*i] && Some(*i) != leader)
                    .or_else(|| self.on_new.iter().position(|n| *n))
                    .ok_or("no member left to downgrade")?;
                cluster.swap(i, &self.old)?;
                self.on_new[i] = false;
                self.log.push(format!("{at:.1} s: m{i} downgraded{}", lead(leader, i)));
            }
            Step::EnableDowngrade => {
                // A downgrade to 0.1 that finished is still enabled in a member's state if no
                // checkpoint was written since (0.1 cannot end it, nor write the agreed
                // versions): as docs/operations.md says, the operator cancels it.
                if downgrade_enabled(channels).await {
                    downgrade_action(channels, DowngradeAction::Cancel, "").await?;
                    self.log.push(format!("{at:.1} s: the finished downgrade cancelled"));
                }
                // Every member runs the new build: the cluster version rises first.
                let risen = await_cluster_version(cluster, |v| v != self.target.as_str()).await?;
                downgrade_action(channels, DowngradeAction::Enable, &self.target).await?;
                await_cluster_version(cluster, |v| v == self.target.as_str()).await?;
                self.log.push(format!(
                    "{at:.1} s: cluster version {risen}, downgrade to {} enabled and the cluster version lowered ({:.1} s later)",
                    self.target,
                    self.started.elapsed().as_secs_f64() - at
                ));
            }
        }
        Ok(())
    }
}

fn lead(leader: Option<usize>, i: usize) -> &'static str {
    if leader == Some(i) {
        " (the leader)"
    } else {
        ""
    }
}

/// Waits until every member's `/version` names a cluster version that `wanted` accepts: that
/// version. Faults are healed meanwhile (the nemesis waits for this step).
async fn await_cluster_version(cluster: &mut Cluster, wanted: impl Fn(&str) -> bool) -> Result<String, String> {
    cluster.net.heal()?;
    cluster.heal_processes()?;
    let deadline = Instant::now() + AGREEMENT;
    loop {
        let seen: Vec<Option<String>> = (0..cluster.members.len())
            .map(|i| {
                let body = http_get(&format!("{}:2379", cluster.net.address(i)), "/version")?;
                let v: serde_json::Value = serde_json::from_str(&body).ok()?;
                v["cairncluster"].as_str().map(str::to_string)
            })
            .collect();
        if let Some(Some(first)) = seen.first() {
            if seen.iter().all(|v| v.as_deref().is_some_and(&wanted)) && seen.iter().all(|v| v.as_ref() == Some(first))
            {
                return Ok(first.clone());
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the members' cluster versions did not settle within {AGREEMENT:?}: {seen:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether any member's Status says a downgrade is enabled (members that checkpointed under
/// 0.1 forgot it; one that did not still holds it).
async fn downgrade_enabled(channels: &[Channel]) -> bool {
    for channel in channels {
        let status = MaintenanceClient::new(channel.clone()).status(StatusRequest {}).await;
        if status.is_ok_and(|s| s.into_inner().downgrade_info.is_some_and(|d| d.enabled)) {
            return true;
        }
    }
    false
}

/// Maintenance.Downgrade `action` (to `target`), through the first member that takes it.
async fn downgrade_action(channels: &[Channel], action: DowngradeAction, target: &str) -> Result<(), String> {
    let deadline = Instant::now() + AGREEMENT;
    loop {
        let mut last = String::new();
        for channel in channels {
            let request = DowngradeRequest {
                action: action.into(),
                version: target.to_string(),
            };
            match MaintenanceClient::new(channel.clone()).downgrade(request).await {
                Ok(_) => return Ok(()),
                Err(s) => last = s.message().to_string(),
            }
        }
        if Instant::now() > deadline {
            return Err(format!("downgrade {action:?} {target}: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
