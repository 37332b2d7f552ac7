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

use super::jobs::{ApiError, Service};

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
        .route("/v1/jobs/{request_id}", get(status))
        .route("/v1/jobs/{request_id}/upload", post(upload).layer(DefaultBodyLimit::max(upload_limit)))
        .route("/v1/jobs/{request_id}/result", get(result))
        .route("/v1/jobs/{request_id}/artifacts", get(artifacts))
        .route("/v1/jobs/{request_id}/artifacts/", get(artifact_empty))
        .route("/v1/jobs/{request_id}/artifacts/{*artifact_path}", get(artifact))
        .route("/v1/jobs/{request_id}/bundle", get(bundle))
        .route("/v1/jobs/{request_id}/logs", get(logs))
        .route("/v1/jobs/{request_id}/cancel", post(cancel))
        .fallback(|| async { ApiError::new(404, "Not Found") })
        .with_state(svc)
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

async fn create(State(svc): State<Arc<Service>>, body: Bytes) -> Reply {
    let body: Value = serde_json::from_slice(&body).map_err(|e| ApiError {
        status: 422,
        detail: json!([{"type": "json_invalid", "loc": ["body", e.column()], "msg": "JSON decode error", "ctx": {"error": e.to_string()}}]),
    })?;
    ok(svc.create(&body).await?)
}

async fn status(State(svc): State<Arc<Service>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.status(&id)?)
}

/// Takes the multipart field `file` into a temporary file (capped), then
/// hands it to the service.
async fn upload(
    State(svc): State<Arc<Service>>,
    id: Result<Path<String>, PathRejection>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let missing = || ApiError::field("missing", &["body", "file"], "Field required");
    let mut multipart = multipart.map_err(|_| missing())?;
    let max = svc.config().max_upload_bytes;
    let mut archive = None;
    loop {
        let field = multipart
            .next_field()
            .await
            .map_err(|e| ApiError::new(400, format!("Invalid multipart body: {e}")))?;
        let Some(mut field) = field else { break };
        if field.name() != Some("file") || archive.is_some() {
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
        archive = Some(tmp);
    }
    let archive = archive.ok_or_else(missing)?;
    ok(svc.upload(&id, archive).await?)
}

async fn result(State(svc): State<Arc<Service>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.result(&id).await?)
}

async fn artifacts(State(svc): State<Arc<Service>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.artifacts(&id).await?)
}

async fn artifact_empty(State(svc): State<Arc<Service>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    svc.artifact(&id, "").await?;
    unreachable!("an empty artifact path is refused")
}

async fn artifact(
    State(svc): State<Arc<Service>>,
    params: Result<Path<(String, String)>, PathRejection>,
) -> Reply {
    let Path((id, path)) = params.map_err(path_error)?;
    let (file, size, name) = svc.artifact(&id, &path).await?;
    Ok(file_response(file, size, &name, mime_of(&name)))
}

async fn bundle(State(svc): State<Arc<Service>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    let (path, name) = svc.bundle(&id).await?;
    let file =
        std::fs::File::open(&path).map_err(|e| ApiError::new(500, format!("cannot open the bundle: {e}")))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok(file_response(file, size, name, "application/zip"))
}

async fn logs(State(svc): State<Arc<Service>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.logs(&id).await?)
}

async fn cancel(State(svc): State<Arc<Service>>, id: Result<Path<String>, PathRejection>) -> Reply {
    let Path(id) = id.map_err(path_error)?;
    ok(svc.cancel(&id).await?)
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
