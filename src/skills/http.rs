//! The HTTP API (axum): upstream's `/v1` routes, JSON bodies and
//! `{"detail": ...}` errors. Each handler takes its typed request
//! ([`super::protocol`]) and calls one method of the service.
//!
//! What a web page could send is refused before any handler runs or any
//! body is read: a state-changing request (`POST`, ...) whose `Origin` is
//! not this server's is 403, a JSON endpoint answers 415 unless the body
//! is `application/json` (which a page cannot send to another origin
//! without a CORS preflight this server never grants), an upload 415
//! unless it is `multipart/form-data`. Bodies must arrive within
//! `--body-timeout` (408). Connections are the listener's
//! ([`super::listener`]).

use std::io::Write;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Multipart, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::events;
use super::jobs::{ApiError, Family, Service};
use super::protocol::{EventsQuery, ReplyRequest};

/// Largest JSON body.
const JSON_LIMIT: usize = 2 << 20;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(json!({"detail": self.detail}))).into_response()
    }
}

type Reply = Result<Response, ApiError>;

fn ok(value: Value) -> Reply {
    Ok(axum::Json(value).into_response())
}

fn path_error(e: PathRejection) -> ApiError {
    ApiError::field("path", &["path"], &e.body_text())
}

/// The router for `svc`.
pub fn router(svc: Arc<Service>) -> Router {
    let upload_limit =
        usize::try_from(svc.config().max_upload_bytes).unwrap_or(usize::MAX).saturating_add(1 << 20);
    Router::new()
        .route("/", get(|| async { axum::Json(json!({"message": "Agent Skill Runner is running"})) }))
        .route("/v1/skills", get(list_skills))
        .route("/v1/skills/{skill_id}", get(get_skill))
        .route("/v1/engines", get(list_engines))
        .route("/v1/engines/{engine}/models", get(engine_models))
        .route("/v1/jobs", post(create))
        .route("/v1/jobs/cleanup", post(cleanup))
        .route("/v1/jobs/{request_id}/upload", post(upload).layer(DefaultBodyLimit::max(upload_limit)))
        .merge(run_routes("/v1/jobs", Family::Jobs))
        .route("/v1/temp-skill-runs", post(temp_create))
        .route(
            "/v1/temp-skill-runs/{request_id}/upload",
            // The package and the inputs zip, each within --max-upload.
            post(temp_upload).layer(DefaultBodyLimit::max(upload_limit.saturating_mul(2))),
        )
        .merge(run_routes("/v1/temp-skill-runs", Family::Temp))
        .route("/v1/skill-packages/install", post(install).layer(DefaultBodyLimit::max(upload_limit)))
        .route("/v1/skill-packages/{request_id}", get(install_status))
        .fallback(|| async { ApiError::new(404, "Not Found") })
        .layer(axum::middleware::from_fn(same_origin))
        .with_state(svc)
}

type IdPath = Result<Path<String>, PathRejection>;
type S = State<Arc<Service>>;

/// The routes of one request family below `prefix`: status, result,
/// artifacts, bundles, logs, events, cancel, interaction.
fn run_routes(prefix: &str, family: Family) -> Router<Arc<Service>> {
    let f = family;
    let at = |tail: &str| format!("{prefix}/{{request_id}}{tail}");
    Router::new()
        .route(&at(""), get(move |s: S, id: IdPath| status(s, id, f)))
        .route(&at("/result"), get(move |s: S, id: IdPath| result(s, id, f)))
        .route(&at("/artifacts"), get(move |s: S, id: IdPath| artifacts(s, id, f)))
        .route(&at("/artifacts/"), get(move |s: S, id: IdPath| artifact_empty(s, id, f)))
        .route(
            &at("/artifacts/{*artifact_path}"),
            get(move |s: S, p: Result<Path<(String, String)>, PathRejection>| artifact(s, p, f)),
        )
        .route(&at("/bundle"), get(move |s: S, id: IdPath| bundle(s, id, f, false)))
        .route(&at("/bundle/debug"), get(move |s: S, id: IdPath| bundle(s, id, f, true)))
        .route(&at("/logs"), get(move |s: S, id: IdPath| logs(s, id, f)))
        .route(&at("/events"), get(move |s: S, id: IdPath, q: RawQuery| events(s, id, q, f)))
        .route(&at("/cancel"), post(move |s: S, id: IdPath| cancel(s, id, f)))
        .route(&at("/interaction/pending"), get(move |s: S, id: IdPath| pending(s, id, f)))
        .route(
            &at("/interaction/reply"),
            post(move |s: S, id: IdPath, h: HeaderMap, b: Body| reply(s, id, h, b, f)),
        )
}

/// Refuses a state-changing request from another origin: a browser
/// sends `Origin` with every cross-origin `POST`, forms included, and a
/// page must not reach a server on this machine that way.
async fn same_origin(request: Request, next: Next) -> Response {
    let safe = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe && let Some(origin) = request.headers().get(header::ORIGIN) {
        let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        let origin = origin.to_str().unwrap_or_default();
        let same =
            origin.strip_prefix("http://").is_some_and(|o| !host.is_empty() && o.eq_ignore_ascii_case(host));
        if !same {
            return ApiError::new(403, format!("Cross-origin requests are not allowed (Origin: {origin})"))
                .into_response();
        }
    }
    next.run(request).await
}

/// The media type of a request (`type/subtype`, lowercase, no parameters).
fn media_type(headers: &HeaderMap) -> String {
    let value = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()
}

fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let t = media_type(headers);
    if t == "application/json" || (t.starts_with("application/") && t.ends_with("+json")) {
        return Ok(());
    }
    Err(ApiError::new(
        415,
        format!("Unsupported Media Type: the body must be application/json, not {}", shown(&t)),
    ))
}

fn require_multipart(headers: &HeaderMap) -> Result<(), ApiError> {
    let t = media_type(headers);
    if t == "multipart/form-data" {
        return Ok(());
    }
    Err(ApiError::new(
        415,
        format!("Unsupported Media Type: the body must be multipart/form-data, not {}", shown(&t)),
    ))
}

fn shown(media_type: &str) -> &str {
    if media_type.is_empty() { "none" } else { media_type }
}

/// A JSON body, sent as `application/json` within the body timeout, or
/// FastAPI's 422 for one that does not parse.
async fn json_body(svc: &Service, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    require_json(headers)?;
    let bytes = tokio::time::timeout(svc.config().body_timeout, axum::body::to_bytes(body, JSON_LIMIT))
        .await
        .map_err(|_| body_timeout(svc))?
        .map_err(|e| ApiError::new(413, format!("Request body too large or unreadable: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError {
        status: 422,
        detail: json!([{"type": "json_invalid", "loc": ["body", e.column()], "msg": "JSON decode error", "ctx": {"error": e.to_string()}}]),
    })
}

fn body_timeout(svc: &Service) -> ApiError {
    ApiError::new(
        408,
        format!("Request body timeout: the body did not arrive within {:?}", svc.config().body_timeout),
    )
}

async fn list_skills(State(svc): S) -> Reply {
    ok(svc.list_skills().await?)
}

async fn get_skill(State(svc): S, id: IdPath) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.get_skill(&id).await?)
}

async fn list_engines(State(svc): S) -> Reply {
    ok(svc.engines())
}

async fn engine_models(State(svc): S, engine: IdPath) -> Reply {
    let Path(engine) = engine.map_err(path_error)?;
    ok(svc.engine_models(&engine)?)
}

async fn create(State(svc): S, headers: HeaderMap, body: Body) -> Reply {
    let body = json_body(&svc, &headers, body).await?;
    ok(svc.create(&body).await?)
}

async fn cleanup(State(svc): S) -> Reply {
    ok(svc.cleanup().await?)
}

async fn status(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.status(family, &id)?)
}

type Form = Result<Multipart, MultipartRejection>;

/// `POST /v1/jobs/{id}/upload`: the multipart field `file`.
async fn upload(State(svc): S, id: IdPath, headers: HeaderMap, form: Form) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let [archive] = read_files(&svc, &headers, form, ["file"]).await?;
    let archive = archive.ok_or_else(|| missing("file"))?;
    ok(svc.upload(&id, archive).await?)
}

async fn temp_create(State(svc): S, headers: HeaderMap, body: Body) -> Reply {
    let body = json_body(&svc, &headers, body).await?;
    ok(svc.temp_create(&body).await?)
}

/// `POST /v1/temp-skill-runs/{id}/upload`: the multipart fields
/// `skill_package` (required) and `file` (the inputs, optional).
async fn temp_upload(State(svc): S, id: IdPath, headers: HeaderMap, form: Form) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let [package, inputs] = read_files(&svc, &headers, form, ["skill_package", "file"]).await?;
    let package = package.ok_or_else(|| missing("skill_package"))?;
    ok(svc.temp_upload(&id, package, inputs).await?)
}

/// `POST /v1/skill-packages/install`: the multipart field `file`.
async fn install(State(svc): S, headers: HeaderMap, form: Form) -> Reply {
    let [package] = read_files(&svc, &headers, form, ["file"]).await?;
    let package = package.ok_or_else(|| missing("file"))?;
    ok(svc.install(package)?)
}

async fn install_status(State(svc): S, id: IdPath) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.install_status(&id)?)
}

fn missing(field: &str) -> ApiError {
    ApiError::field("missing", &["body", field], "Field required")
}

/// Takes the multipart fields `names` into temporary files, each capped
/// at `--max-upload`, the whole body within the body timeout; other
/// fields are skipped, a repeated one ignored.
async fn read_files<const N: usize>(
    svc: &Service,
    headers: &HeaderMap,
    form: Form,
    names: [&str; N],
) -> Result<[Option<std::fs::File>; N], ApiError> {
    require_multipart(headers)?;
    let form = form.map_err(|_| missing(names[0]))?;
    tokio::time::timeout(svc.config().body_timeout, take_fields(svc, form, names))
        .await
        .map_err(|_| body_timeout(svc))?
}

async fn take_fields<const N: usize>(
    svc: &Service,
    mut form: Multipart,
    names: [&str; N],
) -> Result<[Option<std::fs::File>; N], ApiError> {
    let max = svc.config().max_upload_bytes;
    let mut files: [Option<std::fs::File>; N] = std::array::from_fn(|_| None);
    let invalid = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(e.status().as_u16().max(400), format!("Invalid multipart body: {e}"))
    };
    while let Some(mut field) = form.next_field().await.map_err(invalid)? {
        let Some(slot) = names.iter().position(|n| field.name() == Some(n)) else { continue };
        if files[slot].is_some() {
            continue;
        }
        let mut tmp = tempfile::tempfile_in(svc.tmp_dir())
            .map_err(|e| ApiError::new(500, format!("cannot store the upload: {e}")))?;
        let mut size = 0u64;
        while let Some(chunk) = field.chunk().await.map_err(invalid)? {
            size += chunk.len() as u64;
            if size > max {
                return Err(ApiError::new(413, format!("Upload too large: more than {max} bytes")));
            }
            tmp.write_all(&chunk).map_err(|e| ApiError::new(500, format!("cannot store the upload: {e}")))?;
        }
        files[slot] = Some(tmp);
    }
    Ok(files)
}

async fn result(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.result(family, &id).await?)
}

async fn artifacts(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.artifacts(family, &id).await?)
}

async fn artifact_empty(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    svc.artifact(family, &id, "").await?;
    unreachable!("an empty artifact path is refused")
}

async fn artifact(
    State(svc): S,
    params: Result<Path<(String, String)>, PathRejection>,
    family: Family,
) -> Reply {
    let Path((id, path)) = params.map_err(path_error)?;
    let (file, size, name) = svc.artifact(family, &id, &path).await?;
    Ok(file_response(file, size, &name, mime_of(&name)))
}

async fn bundle(State(svc): S, id: IdPath, family: Family, debug: bool) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let (path, name) = svc.bundle(family, &id, debug).await?;
    let file =
        std::fs::File::open(&path).map_err(|e| ApiError::new(500, format!("cannot open the bundle: {e}")))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok(file_response(file, size, name, "application/zip"))
}

async fn logs(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.logs(family, &id).await?)
}

async fn events(State(svc): S, id: IdPath, RawQuery(query): RawQuery, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let from = EventsQuery::parse(query.as_deref())?;
    let stream = events::stream(&svc, family, &id, from)?;
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

async fn cancel(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.cancel(family, &id).await?)
}

async fn pending(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.pending(family, &id)?)
}

async fn reply(State(svc): S, id: IdPath, headers: HeaderMap, body: Body, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let body = json_body(&svc, &headers, body).await?;
    ok(svc.reply(family, &id, ReplyRequest::parse(&body)?).await?)
}

/// Streams an open file as an attachment.
fn file_response(file: std::fs::File, size: u64, name: &str, mime: &'static str) -> Response {
    let file = tokio::fs::File::from_std(file);
    let stream = futures_util::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(Bytes::from(buf)), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    });
    let safe: String =
        name.chars().map(|c| if c == '"' || c == '\\' || c.is_control() { '_' } else { c }).collect();
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{safe}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"));
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    headers.insert(header::CONTENT_DISPOSITION, disposition);
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// A MIME type from the extension; never one a browser renders as a page.
fn mime_of(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "md" => "text/markdown; charset=utf-8",
        "txt" | "log" => "text/plain; charset=utf-8",
        "json" => "application/json",
        "csv" => "text/csv; charset=utf-8",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        _ => "application/octet-stream",
    }
}
