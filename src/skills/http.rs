//! The HTTP API (axum): upstream's `/v1` routes, JSON bodies and
//! `{"detail": ...}` errors (reference §1).

use std::io::Write;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Multipart, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::jobs::{ApiError, Family, Service};

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
        .route("/v1/jobs/{request_id}/upload", post(upload).layer(DefaultBodyLimit::max(upload_limit)))
        .merge(run_routes("/v1/jobs", Family::Jobs))
        .route("/v1/temp-skill-runs", post(temp_create))
        .route(
            "/v1/temp-skill-runs/{request_id}/upload",
            // The package and the inputs zip, each within --max-upload.
            post(temp_upload).layer(DefaultBodyLimit::max(upload_limit.saturating_mul(2))),
        )
        .merge(run_routes("/v1/temp-skill-runs", Family::Temp))
        .fallback(|| async { ApiError::new(404, "Not Found") })
        .with_state(svc)
}

type IdPath = Result<Path<String>, PathRejection>;
type S = State<Arc<Service>>;

/// The routes of one request family below `prefix`: status, result,
/// artifacts, bundle, logs, cancel.
fn run_routes(prefix: &str, family: Family) -> Router<Arc<Service>> {
    let f = family;
    Router::new()
        .route(&format!("{prefix}/{{request_id}}"), get(move |s: S, id: IdPath| status(s, id, f)))
        .route(&format!("{prefix}/{{request_id}}/result"), get(move |s: S, id: IdPath| result(s, id, f)))
        .route(
            &format!("{prefix}/{{request_id}}/artifacts"),
            get(move |s: S, id: IdPath| artifacts(s, id, f)),
        )
        .route(
            &format!("{prefix}/{{request_id}}/artifacts/"),
            get(move |s: S, id: IdPath| artifact_empty(s, id, f)),
        )
        .route(
            &format!("{prefix}/{{request_id}}/artifacts/{{*artifact_path}}"),
            get(move |s: S, p: Result<Path<(String, String)>, PathRejection>| artifact(s, p, f)),
        )
        .route(&format!("{prefix}/{{request_id}}/bundle"), get(move |s: S, id: IdPath| bundle(s, id, f)))
        .route(&format!("{prefix}/{{request_id}}/logs"), get(move |s: S, id: IdPath| logs(s, id, f)))
        .route(&format!("{prefix}/{{request_id}}/cancel"), post(move |s: S, id: IdPath| cancel(s, id, f)))
}

async fn list_skills(State(svc): State<Arc<Service>>) -> Reply {
    ok(svc.list_skills().await?)
}

async fn get_skill(State(svc): State<Arc<Service>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.get_skill(&id).await?)
}

async fn list_engines(State(svc): State<Arc<Service>>) -> Reply {
    ok(svc.engines())
}

async fn engine_models(
    State(svc): State<Arc<Service>>,
    engine: Result<Path<String>, PathRejection>,
) -> Reply {
    let Path(engine) = engine.map_err(path_error)?;
    ok(svc.engine_models(&engine)?)
}

/// A JSON body, or FastAPI's 422 for one that does not parse.
fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError {
        status: 422,
        detail: json!([{"type": "json_invalid", "loc": ["body", e.column()], "msg": "JSON decode error", "ctx": {"error": e.to_string()}}]),
    })
}

async fn create(State(svc): S, body: Bytes) -> Reply {
    ok(svc.create(&json_body(&body)?).await?)
}

async fn status(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.status(family, &id)?)
}

/// `POST /v1/jobs/{id}/upload`: the multipart field `file`.
async fn upload(
    State(svc): S,
    id: IdPath,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let [archive] = read_files(&svc, multipart, ["file"]).await?;
    let archive = archive.ok_or_else(|| missing("file"))?;
    ok(svc.upload(&id, archive).await?)
}

async fn temp_create(State(svc): S, body: Bytes) -> Reply {
    ok(svc.temp_create(&json_body(&body)?).await?)
}

/// `POST /v1/temp-skill-runs/{id}/upload`: the multipart fields
/// `skill_package` (required) and `file` (the inputs, optional).
async fn temp_upload(
    State(svc): S,
    id: IdPath,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let [package, inputs] = read_files(&svc, multipart, ["skill_package", "file"]).await?;
    let package = package.ok_or_else(|| missing("skill_package"))?;
    ok(svc.temp_upload(&id, package, inputs).await?)
}

fn missing(field: &str) -> ApiError {
    ApiError::field("missing", &["body", field], "Field required")
}

/// Takes the multipart fields `names` into temporary files, each capped
/// at `--max-upload`; other fields are skipped, a repeated one ignored.
async fn read_files<const N: usize>(
    svc: &Service,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
    names: [&str; N],
) -> Result<[Option<std::fs::File>; N], ApiError> {
    let mut multipart = multipart.map_err(|_| missing(names[0]))?;
    let max = svc.config().max_upload_bytes;
    let mut files: [Option<std::fs::File>; N] = std::array::from_fn(|_| None);
    loop {
        let field = multipart
            .next_field()
            .await
            .map_err(|e| ApiError::new(400, format!("Invalid multipart body: {e}")))?;
        let Some(mut field) = field else { break };
        let Some(slot) = names.iter().position(|n| field.name() == Some(n)) else { continue };
        if files[slot].is_some() {
            continue;
        }
        let mut tmp = tempfile::tempfile_in(svc.tmp_dir())
            .map_err(|e| ApiError::new(500, format!("cannot store the upload: {e}")))?;
        let mut size = 0u64;
        while let Some(chunk) =
            field.chunk().await.map_err(|e| ApiError::new(400, format!("Invalid multipart body: {e}")))?
        {
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

async fn bundle(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let (path, name) = svc.bundle(family, &id).await?;
    let file =
        std::fs::File::open(&path).map_err(|e| ApiError::new(500, format!("cannot open the bundle: {e}")))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok(file_response(file, size, name, "application/zip"))
}

async fn logs(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.logs(family, &id).await?)
}

async fn cancel(State(svc): S, id: IdPath, family: Family) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.cancel(family, &id).await?)
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

/// How long open requests may take to finish once shutdown begins.
pub const SHUTDOWN_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves until `shutdown` completes, then stops accepting and gives the
/// requests still open [`SHUTDOWN_DRAIN`] to finish: a client that stops
/// reading a download must not keep the server from stopping.
pub async fn serve(
    svc: Arc<Service>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (begun_tx, begun_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        let _ = begun_tx.send(());
    };
    let server = axum::serve(listener, router(svc)).with_graceful_shutdown(signal);
    let deadline = async move {
        if begun_rx.await.is_err() {
            return std::future::pending().await;
        }
        tokio::time::sleep(SHUTDOWN_DRAIN).await;
    };
    tokio::select! {
        served = server => served,
        () = deadline => {
            tracing::warn!("stopping with requests still open after {SHUTDOWN_DRAIN:?}");
            Ok(())
        }
    }
}
