//! The axum router: the OpenAI endpoints, `/health`, `/metrics`, and the
//! event stream of a `stream: true` request.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::api::{self, Endpoint, Head};
use super::body::ReadBody;
use super::engine::{Engine, Event, Outcome, Ticket};
use super::error::ApiError;
use super::metrics::Metrics;

/// What every handler shares.
#[derive(Debug, Clone)]
pub(super) struct AppState {
    /// The engine handle.
    pub engine: Engine,
    /// The figures.
    pub metrics: Arc<Metrics>,
    /// `--max-body-bytes`.
    pub max_body: usize,
    /// `--read-timeout`, for the body (hyper's connection times the headers).
    pub read_timeout: Duration,
    /// Numbers the response ids.
    pub ids: Arc<AtomicU64>,
}

/// The router of every route.
pub(super) fn router(state: AppState) -> Router {
    let limit = state.max_body;
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Counts every response by route and status.
async fn count(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_owned();
    let r = next.run(req).await;
    s.metrics.record_request(&route, r.status().as_u16());
    r
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

async fn health(State(s): State<AppState>) -> Response {
    if s.engine.accepting() {
        axum::Json(json!({"status": "ok"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "unavailable: shutting down, or the engine stopped"})),
        )
            .into_response()
    }
}

async fn models(State(s): State<AppState>) -> axum::Json<Value> {
    let c = s.engine.card();
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": c.id,
            "object": "model",
            "created": now(),
            "owned_by": "mtp-runner",
            "max_model_len": c.context_length,
            "speculation": c.speculation,
            "chat": c.chat,
        }],
    }))
}

async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn chat(State(s): State<AppState>, ReadBody(body): ReadBody) -> Response {
    complete(s, body, Endpoint::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(s): State<AppState>, ReadBody(body): ReadBody) -> Response {
    complete(s, body, Endpoint::Completions)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn complete(s: AppState, body: Bytes, endpoint: Endpoint) -> Result<Response, ApiError> {
    let card = s.engine.card();
    let req = api::parse(&body, endpoint, &card.id)?;
    let prepared = s
        .engine
        .prepare(&req.prompt, &req.params, endpoint.prompt_field())?;
    let (tx, mut rx) = unbounded_channel();
    let ticket = s.engine.submit(prepared, tx)?;
    // Wait until the request runs: an error found there still gets its status.
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(e)) => return Err(e),
        Some(other) => return Err(ApiError::internal(format!("engine sent {other:?} first"))),
        None => return Err(ApiError::unavailable("the engine stopped")),
    }
    let n = s.ids.fetch_add(1, Ordering::Relaxed);
    let head = Head {
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-{n}"),
            Endpoint::Completions => format!("cmpl-{n}"),
        },
        created: now(),
        model: card.id.clone(),
        endpoint,
    };
    if req.stream {
        let events = sse(head, rx, ticket, req.include_usage);
        return Ok(Sse::new(events)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response());
    }
    let mut text = String::new();
    let outcome = loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(o)) => break *o,
            Some(Event::Failed(e)) => return Err(e),
            Some(Event::Started) => {}
            None => return Err(ApiError::unavailable("the engine stopped")),
        }
    };
    drop(ticket);
    Ok(axum::Json(head.response(&text, &outcome)).into_response())
}

/// Where an event stream is.
struct Streaming {
    head: Head,
    rx: UnboundedReceiver<Event>,
    /// Dropped with the stream: a client that disconnects cancels the request.
    _ticket: Ticket,
    include_usage: bool,
    /// The role chunk (chat) is still to send.
    opening: bool,
    done: bool,
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// The chunks of one request, then `[DONE]`.
fn sse(
    head: Head,
    rx: UnboundedReceiver<Event>,
    ticket: Ticket,
    include_usage: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let opening = head.endpoint == Endpoint::Chat;
    let st = Streaming {
        head,
        rx,
        _ticket: ticket,
        include_usage,
        opening,
        done: false,
    };
    stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        if st.opening {
            st.opening = false;
            let first = vec![data(&st.head.role_chunk())];
            return Some((first, st));
        }
        let (events, done) = loop {
            match st.rx.recv().await {
                Some(Event::Text(t)) => break (vec![data(&st.head.text_chunk(&t))], false),
                Some(Event::Done(o)) => break (end(&st, Some(&o)), true),
                Some(Event::Failed(e)) => break (failed(&st, &e), true),
                Some(Event::Started) => {}
                None => {
                    break (
                        failed(&st, &ApiError::unavailable("the engine stopped")),
                        true,
                    );
                }
            }
        };
        st.done = done;
        Some((events, st))
    })
    .flat_map(|v| stream::iter(v.into_iter().map(Ok)))
}

/// The marker of the last event of a stream.
const DONE: &str = "[DONE]";

fn end(st: &Streaming, o: Option<&Outcome>) -> Vec<SseEvent> {
    let mut v = Vec::new();
    if let Some(o) = o {
        v.push(data(&st.head.finish_chunk(o.finish)));
        if st.include_usage {
            v.push(data(&st.head.usage_chunk(o)));
        }
    }
    v.push(SseEvent::default().data(DONE));
    v
}

/// An error object (headers are sent: the status stays 200), then `[DONE]`.
fn failed(st: &Streaming, e: &ApiError) -> Vec<SseEvent> {
    let mut v = vec![data(&e.body())];
    v.extend(end(st, None));
    v
}
