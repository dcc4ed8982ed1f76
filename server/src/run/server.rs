//! Running a member: the engine opened from the flags, the gRPC services and HTTP endpoints on
//! every client URL, the peer transport on every peer URL, the HTTP endpoints alone on every
//! metrics URL (each over TLS where its URL is https), auto-compaction, and a graceful stop on
//! SIGTERM or SIGINT (in-flight requests finish, then the engine checkpoints and closes).

use std::sync::Arc;
use std::time::Duration;

use cairn_engine::Engine;

use crate::api;
use crate::api::metrics::Metrics;
use crate::api::node::Node;
use crate::config::{self, Flags};
use crate::transport::peer::{Dialer, PeerNetwork};
use crate::transport::tls::Connector;

pub use super::error::ServeError;
use super::identity::identity;
use super::listeners::{bind_all, serve_on, Port};
use super::plan::{log_settings, plan};
use super::router::client_routes;

/// How long requests in flight may take to finish once a stop is asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called, not when
/// the future is first polled: a signal sent as soon as the member says it serves must stop
/// it gracefully, not kill it by the default action.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let watch = |kind: SignalKind, name: &'static str| match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch for {name}");
            None
        }
    };
    let term = watch(SignalKind::terminate(), "SIGTERM");
    let int = watch(SignalKind::interrupt(), "SIGINT");
    async move {
        let recv = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = recv(term) => {}
            () = recv(int) => {}
        }
    }
}

/// Runs a member until SIGTERM or SIGINT.
pub async fn serve(f: Flags) -> Result<(), ServeError> {
    let mut plan = plan(&f, None)?;
    log_settings(&f, &plan);
    if plan.pprof {
        // Before the data is loaded, so that the heap profile shows what holds it.
        api::pprof::start_heap_sampling();
    }
    if let Some(found) = crate::transport::discovery::run(&f, plan.member_id, &plan.dir.join("member")).await? {
        plan = self::plan(&f, Some(&found))?;
    }
    let member_dir = plan.dir.join("member");
    let (member_id, cluster_id) = identity(&plan, &member_dir).await?;
    plan.member_id = member_id;
    let cluster = Arc::new(crate::transport::peer::ClusterId::new(cluster_id));
    let extensive = f.observability.metrics == config::MetricsLevel::Extensive;
    let metrics = Arc::new(Metrics::new(extensive).map_err(|e| ServeError::Other(e.to_string()))?);
    let dialer = Dialer {
        connector: Connector::new(plan.peer_tls.clone()),
        metrics: metrics.peers.clone(),
    };
    let peers = PeerNetwork::new(member_id, cluster.clone(), &plan.initial_peers, dialer);
    // Bind first: a port in use is reported before anything is opened.
    let client_listeners = bind_all(&plan.client_urls, plan.sockets).await?;
    let client_http_listeners = bind_all(&plan.client_http_urls, plan.sockets).await?;
    let peer_listeners = bind_all(&plan.peer_urls, plan.sockets).await?;
    let metrics_listeners = bind_all(&plan.metrics_urls, plan.sockets).await?;
    // A new member of an existing cluster starts hearing from the leader only once its peer
    // listener is up: serve peers before opening the engine, which waits to catch up.
    let inbox = peers.inbox_slot();
    let kept = Arc::new(crate::transport::peer::Kept::default());
    for bound in peer_listeners {
        let router =
            crate::transport::peer::router(inbox.clone(), cluster.clone(), kept.clone(), metrics.peers.clone());
        let port = Port {
            name: "peer",
            tls: plan.peer_tls.as_ref(),
            http2: crate::transport::listen::Http2::default(),
        };
        let serving = serve_on(bound, &port, router, std::future::pending())?;
        tokio::spawn(async move {
            if let Ok(Err(e)) = serving.await {
                tracing::error!(error = %e, "the peer listener failed");
            }
        });
    }
    let engine = {
        let mut builder = Engine::builder(&member_dir)
            .config(plan.config.clone())
            .member(member_id)
            .transport(peers.transport());
        if plan.force_new_cluster {
            builder = builder.force_new_cluster();
        }
        builder = if plan.join_existing {
            // It learns the members, and everything else, from the cluster's log.
            builder.join_existing()
        } else {
            builder.peers(plan.initial_members.clone())
        };
        tokio::task::spawn_blocking(move || builder.open())
            .await
            .map_err(|e| ServeError::Other(e.to_string()))?
            .map_err(|source| ServeError::Open {
                dir: plan.dir.clone(),
                source,
            })?
    };
    let engine = Arc::new(engine);
    let engine_inbox = engine.inbox().map_err(|e| ServeError::Other(e.to_string()))?;
    peers.attach(&engine, engine_inbox);
    let node = Arc::new(Node {
        engine: engine.clone(),
        cluster: cluster.clone(),
        member_id,
        limits: plan.limits,
        forward: crate::transport::forward::Forwarder::new(Connector::new(plan.client_tls.clone())),
        access: plan.access.clone(),
        leaderless: tokio::sync::watch::channel(0).0,
    });
    let peer_connector = Connector::new(plan.peer_tls.clone());
    if plan.checks.initial {
        crate::job::corruption::initial_check(&node, &peer_connector)
            .await
            .map_err(ServeError::Other)?;
    }
    let (auto_promote, promoting) = (f.auto_promote_learners, node.clone());
    let every = Duration::from_millis(f.heartbeat_interval.saturating_mul(5));
    let (published, published_rx) = tokio::sync::oneshot::channel();
    let background = [
        tokio::spawn(publish(
            node.clone(),
            (f.name.clone(), plan.advertise_client_urls.clone()),
            published,
        )),
        tokio::spawn(crate::job::compactor::run(
            node.clone(),
            f.auto_compaction_mode,
            f.auto_compaction_retention.clone(),
        )),
        tokio::spawn(api::node::watch_leader(
            node.clone(),
            Duration::from_millis(f.election_timeout),
        )),
        tokio::spawn(async move {
            if auto_promote {
                crate::job::promoter::run(promoting, every).await;
            }
        }),
        tokio::spawn(crate::job::versions::run(
            node.clone(),
            peer_connector.clone(),
            plan.version_checks,
        )),
        tokio::spawn(crate::job::corruption::run(
            node.clone(),
            peer_connector,
            plan.checks,
            kept,
        )),
    ];
    let http_only = api::http::router(node.clone(), metrics.clone());
    let routes = client_routes(node.clone(), metrics, f.initial_cluster_token.clone(), &plan);
    // From here on SIGTERM and SIGINT stop the member gracefully.
    let stopped = stop_signal();
    tracing::info!(
        name = %f.name,
        member = format_args!("{member_id:x}"),
        cluster = format_args!("{:x}", cluster.get()),
        clients = ?plan.client_urls,
        data_dir = %plan.dir.display(),
        release = cairn_engine::version::RELEASE,
        cluster_version = %engine.server().versions().cluster(),
        storage_version = %engine.server().versions().cluster(),
        "serving"
    );
    // etcd serves clients once this member's name and client URLs are in the membership, so a
    // client's first member list names them. cairn waits for that too, but an election
    // timeout at most: a member that cannot reach a quorum yet still serves health and
    // serializable reads (and a harness that waits for one member before starting the next
    // still gets it).
    let _ = tokio::time::timeout(Duration::from_millis(f.election_timeout), published_rx).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // With --listen-client-http-urls, HTTP moves off the client URLs onto those.
    let http_apart = !plan.client_http_urls.is_empty();
    let listeners = client_listeners
        .into_iter()
        .map(|b| (b, true, !http_apart))
        .chain(client_http_listeners.into_iter().map(|b| (b, false, true)));
    let client = Port {
        name: "client",
        tls: plan.client_tls.as_ref(),
        http2: plan.http2,
    };
    for (bound, grpc, http) in listeners {
        let router = routes.router(grpc, http, bound.url.starts_with("https://"));
        servers.push(serve_on(bound, &client, router, stop(stop_rx.clone()))?);
    }
    let metrics_port = Port {
        name: "metrics",
        ..client
    };
    for bound in metrics_listeners {
        servers.push(serve_on(
            bound,
            &metrics_port,
            http_only.clone(),
            stop(stop_rx.clone()),
        )?);
    }
    crate::run::systemd::ready();
    let watchdog =
        crate::run::systemd::watchdog_period().map(|period| tokio::spawn(crate::run::systemd::keep_alive(period)));
    stopped.await;
    crate::run::systemd::stopping();
    if let Some(w) = watchdog {
        w.abort();
    }
    // A leader hands its leadership over first, as etcd does on shutdown: the others go on
    // without waiting out an election timeout, and the writes in flight carry over to the
    // new leader (the node holds what raft cannot take during the handover).
    let leaving = engine.clone();
    match tokio::task::spawn_blocking(move || leaving.members().step_down()).await {
        Ok(Ok(Some(to))) => tracing::info!(leader = %format!("{to:x}"), "stopping: handed the leadership over"),
        Ok(Ok(None)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "stopping: could not hand the leadership over"),
        Err(e) => tracing::warn!(error = %e, "stopping: could not hand the leadership over"),
    }
    tracing::info!("stopping: finishing requests in flight");
    let _ = stop_tx.send(true);
    // Requests in flight finish; streams that would outlive the grace period (a watch never
    // ends by itself) are cut when it is over.
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    for mut s in servers {
        match tokio::time::timeout_at(deadline, &mut s).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "a client listener stopped with an error"),
            Ok(_) => {}
            Err(_) => {
                tracing::info!("closing the streams still open");
                s.abort();
            }
        }
    }
    for task in background {
        task.abort();
        let _ = task.await;
    }
    drop(routes);
    peers.detach();
    drop(node);
    let closed = tokio::task::spawn_blocking(move || match Arc::try_unwrap(engine) {
        Ok(engine) => engine.close(),
        // Something still holds it (a stream that outlived its listener): its drop closes it.
        Err(_) => Ok(()),
    })
    .await
    .map_err(|e| ServeError::Other(e.to_string()))?;
    closed.map_err(|e| ServeError::Other(format!("closing the engine: {e}")))?;
    tracing::info!("stopped");
    Ok(())
}

/// Records this member's name and client URLs in the cluster once it can (etcd's publish),
/// retrying until it is applied; then says so on `published`.
async fn publish(node: Arc<Node>, attributes: (String, Vec<String>), published: tokio::sync::oneshot::Sender<()>) {
    let (name, client_urls) = attributes;
    loop {
        let already = node
            .engine
            .members()
            .list()
            .into_iter()
            .any(|m| m.id == node.member_id && m.name == name && m.client_urls == client_urls);
        if already {
            let _ = published.send(());
            return;
        }
        let (n, urls) = (name.clone(), client_urls.clone());
        match node.blocking(move |e| e.server().member_publish(n, urls)).await {
            Ok(()) => {
                let _ = published.send(());
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e.message(), "publishing this member's attributes; will retry");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
