//! The dashboard room: an HTTP server on the node's runtime with the live page, its data as JSON and server-sent events, task logs, and Prometheus metrics.
//!
//! It reads what `mesh status --json` reads (the control requests, through
//! a [`Source`]), so the CLI, the page and the metrics show the same
//! fields. One poller folds that into a bounded [`view::DashView`] once a
//! second, whatever the number of pages open.

pub mod metrics;
pub mod view;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::Stream;
use serde::Deserialize;
use tokio::sync::watch;

use crate::view::{FarmView, Observed};
use view::Model;

/// How often the page's data is rebuilt and pushed.
pub const UPDATE_MS: u64 = 1000;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Where the dashboard reads: a mesh node, or `mesh run`'s loop.
pub trait Source: Send + Sync + 'static {
    /// The status and each node's record, runs that changed after `since[node]`.
    fn observe(&self, since: HashMap<String, u64>) -> BoxFuture<Result<Observed, SourceError>>;
    /// The farms to show, with their stages and failures, the running first.
    fn farms(&self) -> BoxFuture<Result<Vec<FarmView>, SourceError>>;
    /// A task's logs, stdout then stderr.
    fn logs(
        &self,
        farm: String,
        task: String,
        attempt: Option<u32>,
    ) -> BoxFuture<Result<String, SourceError>>;
}

/// Why a [`Source`] has nothing to show.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The node's control answer [`crate::control::ControlResponse::Error`], in its words.
    #[error("{0}")]
    Refused(String),
    #[error("the node is stopping")]
    Stopping,
    #[error(transparent)]
    Task(#[from] crate::task_words::TaskIdError),
    /// The task as the page named it.
    #[error("{0} has written no logs")]
    NoLogs(String),
}

/// Why the dashboard cannot be served where it was asked.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "a dashboard on {0} (not loopback) needs a token, derived from the mesh's \
         mesh.key; there is none here: serve it on 127.0.0.1, or give --key"
    )]
    NoToken(SocketAddr),
}

/// A task's logs as the page shows them: stdout, then stderr under a rule.
pub fn logs_text(out: &[u8], err: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(out).into_owned();
    if !err.is_empty() {
        text.push_str("\n--- stderr ---\n");
        text.push_str(&String::from_utf8_lossy(err));
    }
    if text.is_empty() {
        text.push_str("(this attempt wrote nothing)\n");
    }
    text
}

/// Where to serve, and the token asked of every request (None on loopback).
#[derive(Clone, Debug)]
pub struct Http {
    pub addr: SocketAddr,
    pub token: Option<String>,
}

impl Http {
    /// Loopback needs no token; any other address needs the one derived
    /// from the mesh secret, so only those who hold `mesh.key` see the farm.
    pub fn new(addr: SocketAddr, key: Option<&[u8]>) -> Result<Http, HttpError> {
        if addr.ip().is_loopback() {
            return Ok(Http { addr, token: None });
        }
        match key {
            Some(k) => Ok(Http {
                addr,
                token: Some(token_for(k)),
            }),
            None => Err(HttpError::NoToken(addr)),
        }
    }
}

/// The dashboard token of a mesh secret: not the secret, not its public
/// fingerprint, and the same on every node of the mesh.
pub fn token_for(key: &[u8]) -> String {
    let k = blake3::derive_key("mesh 2026 dashboard token", key);
    blake3::Hash::from(k).to_hex()[..32].to_string()
}

/// What a user is told of the dashboard: its address, with the token
/// when one is needed.
pub fn dashboard_line(addr: SocketAddr, token: Option<&str>) -> String {
    match token {
        Some(t) => format!("dashboard: http://{addr}/?token={t}"),
        None => format!("dashboard: http://{addr}/"),
    }
}

/// What every request sees: the newest update and how to reach the source.
#[derive(Clone)]
struct App {
    latest: watch::Receiver<Arc<Update>>,
    source: Arc<dyn Source>,
    token: Option<String>,
}

/// One update: the page's JSON, and what the metrics are made of.
#[derive(Default)]
pub struct Update {
    pub json: String,
    pub observed: Option<Observed>,
    pub farms: Vec<FarmView>,
}

/// Binds `http.addr` and serves the dashboard on the current runtime.
/// Returns the address bound (a port of 0 is chosen by the system).
pub async fn serve(http: Http, source: Arc<dyn Source>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(http.addr).await?;
    let bound = listener.local_addr()?;
    let (tx, rx) = watch::channel(Arc::new(Update::default()));
    tokio::spawn(poll(source.clone(), tx));
    let app = router(rx, source, http.token);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!("dashboard stopped: {e}");
        }
    });
    Ok(bound)
}

/// Rebuilds the update once a second while anyone may look.
async fn poll(source: Arc<dyn Source>, tx: watch::Sender<Arc<Update>>) {
    let mut model = Model::default();
    let mut tick = tokio::time::interval(Duration::from_millis(UPDATE_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (observed, farms) = match (source.observe(model.since()).await, source.farms().await) {
            (Ok(o), Ok(f)) => (o, f),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!("dashboard poll: {e}");
                if tx.is_closed() {
                    return;
                }
                continue;
            }
        };
        let view = model.update(crate::state::unix_ms(), &observed, &farms);
        let json = view.to_json();
        let update = Update {
            json,
            observed: Some(observed),
            farms,
        };
        if tx.send(Arc::new(update)).is_err() {
            return;
        }
    }
}

/// The dashboard's routes over a stream of updates.
pub fn router(
    latest: watch::Receiver<Arc<Update>>,
    source: Arc<dyn Source>,
    token: Option<String>,
) -> Router {
    let app = App {
        latest,
        source,
        token,
    };
    Router::new()
        .route("/", get(index))
        .route("/app.js", get(script))
        .route("/style.css", get(style))
        .route("/api/status", get(status))
        .route("/api/events", get(events))
        .route("/api/nodes", get(nodes))
        .route("/api/logs/{farm}/{task}", get(logs))
        .route("/metrics", get(prometheus))
        .layer(middleware::from_fn_with_state(app.clone(), authorize))
        .with_state(app)
}

#[derive(Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

/// With a token set, a request must carry it: `Authorization: Bearer T`
/// (scrapers, scripts) or `?token=T` (the page, whose event stream cannot
/// set headers).
async fn authorize(
    State(app): State<App>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let Some(want) = &app.token else {
        return next.run(req).await;
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer.or(q.token.as_deref());
    // Compared as hashes: equal in constant time.
    let ok = given.is_some_and(|g| blake3::hash(g.as_bytes()) == blake3::hash(want.as_bytes()));
    if ok {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            "this dashboard needs the token its node printed at start: add ?token=TOKEN to the address\n",
        )
            .into_response()
    }
}

async fn index() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("assets/index.html"),
    )
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/app.js"),
    )
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/style.css"),
    )
}

/// The newest update, waiting for the first one at start.
async fn current(app: &App) -> Arc<Update> {
    let mut rx = app.latest.clone();
    let ready = rx.wait_for(|u| !u.json.is_empty()).await.map(|u| u.clone());
    ready.unwrap_or_else(|_| app.latest.borrow().clone())
}

async fn status(State(app): State<App>) -> Response {
    let u = current(&app).await;
    ([(header::CONTENT_TYPE, "application/json")], u.json.clone()).into_response()
}

async fn events(State(app): State<App>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut rx = app.latest.clone();
    rx.mark_changed();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            let u = rx.borrow_and_update().clone();
            if !u.json.is_empty() {
                return Some((Ok(Event::default().data(u.json.as_str())), rx));
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// A page of the node table (filtered, sorted) from the newest update:
/// the page asks for the rows it shows rather than every node each second.
async fn nodes(State(app): State<App>, Query(q): Query<view::NodeQuery>) -> Response {
    let u = current(&app).await;
    let page = match &u.observed {
        Some(o) => view::node_page(&o.status, &q),
        None => view::NodePage::default(),
    };
    axum::Json(page).into_response()
}

#[derive(Deserialize)]
struct AttemptQuery {
    attempt: Option<u32>,
}

async fn logs(
    State(app): State<App>,
    Path((farm, task)): Path<(String, String)>,
    Query(q): Query<AttemptQuery>,
) -> Response {
    match app.source.logs(farm, task, q.attempt).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
    }
}

async fn prometheus(State(app): State<App>) -> Response {
    let u = current(&app).await;
    match metrics::render(u.observed.as_ref(), &u.farms) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests;
