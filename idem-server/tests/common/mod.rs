//! What the server's tests share: a server on a real SQLite store in a temporary directory,
//! listening on a free port, and its tokens.

#![allow(dead_code)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, Response};
use http_body_util::BodyExt;
use idem::store::url::{ConnectOptions, StoreUrl};
use idem_core::Store;
use idem_server::{auth::Tokens, router, App, Config};
use tower::ServiceExt;

pub const ADMIN: &str = "admin-token-0123456789";
pub const ALICE: &str = "alice-token-0123456789";
pub const BOB: &str = "bob-token-0123456789abc";

pub fn tokens() -> Tokens {
    Tokens::new(ADMIN, &[format!("alice={ALICE}"), format!("bob={BOB}")]).unwrap()
}

/// A SQLite store in `dir`.
pub async fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("idem.db").display());
    StoreUrl::parse(&url)
        .unwrap()
        .connect(&ConnectOptions::new())
        .await
        .unwrap()
        .into_store()
}

/// A server listening on a free local port; stopped when dropped.
pub struct Server {
    pub url: String,
    pub app: App,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve(config: Config) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(&dir).await;
    serve_on(store, config, dir).await
}

/// A server over `store` (`dir` is dropped with it), listening on a free local port.
pub async fn serve_on(store: Arc<dyn Store>, config: Config, dir: tempfile::TempDir) -> Server {
    let app = App::new(store, tokens(), config, None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let routes = router(app.clone());
    let task = tokio::spawn(async move {
        axum::serve(listener, routes).await.unwrap();
    });
    Server {
        url,
        app,
        task,
        _dir: dir,
    }
}

/// One request through the router in-process: status, content type and body.
pub async fn call(app: &App, request: Request<Body>) -> (u16, String, Vec<u8>) {
    answer(router(app.clone()).oneshot(request).await.unwrap()).await
}

/// A response's status, content type and body.
pub async fn answer(response: Response<Body>) -> (u16, String, Vec<u8>) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, content_type, body)
}

/// A JSON request to `path` with `token`.
pub fn json(path: &str, token: Option<&str>, body: serde_json::Value) -> Request<Body> {
    let mut r = Request::post(path).header("content-type", "application/json");
    if let Some(t) = token {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    r.body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

/// Runs the Python script `script` with `python` and the environment `env`, for at most two
/// minutes: whether it exited 0, and what it printed (its stdout; both streams are shown in
/// the test's output).
pub async fn run_python(python: &str, script: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut command = tokio::process::Command::new(python);
    command.arg(script).envs(env.iter().copied());
    let run = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .expect("the Python script ran for over two minutes")
        .expect("the Python named by IDEM_DIOM_PYTHON does not run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), stdout)
}
