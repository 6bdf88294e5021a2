//! The service hop's cost: start+complete of new keys and the replay of completed ones, through
//! idem-server (HTTP/1.1 on loopback, MessagePack as Diom's clients send it, pooled keep-alive
//! connections) against the same calls on the engine in process (`Call::claim` then
//! `Idempotency::finish`), on the same store, in one run.
//!
//! ```text
//! cargo run --release -p idem-server --features redis --example hop_bench -- \
//!     [--ops 20000] [--concurrency 16] sqlite://bench.db?mode=rwc postgres://… redis://…
//! ```

use std::error::Error;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem::store::url::{ConnectOptions, StoreUrl};
use idem_core::{CallClaim, Idempotency, Key};
use idem_server::{auth::Tokens, router, App, Config};
use serde::Serialize;

const TOKEN: &str = "bench-admin-token-0123456789";

#[derive(Serialize)]
struct Start<'a> {
    key: &'a str,
    lock_period_ms: u64,
}

#[derive(Serialize)]
struct Complete<'a> {
    key: &'a str,
    #[serde(with = "serde_bytes")]
    response: &'a [u8],
    ttl_ms: u64,
}

/// Throughput and latency of one path.
struct Stats {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// Runs `op(i)` for `i` in `0..ops` on `concurrency` tasks; each op is timed.
async fn measure<F, Fut>(ops: usize, concurrency: usize, op: F) -> Stats
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let began = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut took = Vec::with_capacity(ops / concurrency + 1);
                for i in (t..ops).step_by(concurrency) {
                    let at = Instant::now();
                    op(i).await;
                    took.push(at.elapsed());
                }
                took
            })
        })
        .collect();
    let mut all = Vec::with_capacity(ops);
    for t in tasks {
        all.extend(t.await.expect("a bench task panicked"));
    }
    let elapsed = began.elapsed();
    all.sort();
    Stats {
        per_second: ops as f64 / elapsed.as_secs_f64(),
        p50: all[all.len() / 2],
        p99: all[all.len() * 99 / 100],
    }
}

fn row(store: &str, path: &str, engine: &Stats, server: &Stats) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "| {store} | {path} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | +{:.0} µs |",
        engine.per_second,
        server.per_second,
        us(engine.p50),
        us(server.p50),
        us(engine.p99),
        us(server.p99),
        us(server.p50) - us(engine.p50),
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let (mut ops, mut concurrency, mut urls) = (20_000usize, 16usize, Vec::new());
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--ops" => ops = args.next().ok_or("--ops takes a number")?.parse()?,
            "--concurrency" => {
                concurrency = args.next().ok_or("--concurrency takes a number")?.parse()?
            }
            url => urls.push(url.to_owned()),
        }
    }
    println!("{ops} keys a path, {concurrency} concurrent callers; latencies in µs");
    println!("| store | path | engine ops/s | server ops/s | engine p50 | server p50 | engine p99 | server p99 | hop (p50) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for url in urls {
        let parsed = StoreUrl::parse(&url)?;
        let table = format!("idem_hop_bench_{:08x}", fastrand::u32(..));
        let options = ConnectOptions::new()
            .namespace(table)
            .create_table_if_missing(true)
            .max_connections(concurrency as u32 + 4);
        let store = parsed.connect(&options).await?.into_store();
        let engine = Idempotency::builder_from_arc(store.clone()).build()?;

        let key = |i: usize| Key::derive("bench", "", &format!("e{i}")).expect("a valid key");
        let e = engine.clone();
        let fresh = measure(ops, concurrency, move |i| {
            let e = e.clone();
            async move {
                let Ok(CallClaim::Claimed(claim)) = e.call(key(i)).claim().await else {
                    panic!("key {i} was not new");
                };
                e.finish("bench", &claim, b"ok".to_vec())
                    .await
                    .expect("finish");
            }
        })
        .await;
        let e = engine.clone();
        let replay = measure(ops, concurrency, move |i| {
            let e = e.clone();
            async move {
                let replayed = e.call(key(i)).claim().await;
                assert!(matches!(replayed, Ok(CallClaim::Completed(_))), "key {i}");
            }
        })
        .await;

        let app = App::new(store, Tokens::new(TOKEN, &[])?, Config::default(), None)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, router(app)).await });
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(concurrency)
            .build_http::<Full<Bytes>>();
        let post = {
            let (client, base) = (client.clone(), base.clone());
            move |route: &'static str, body: Vec<u8>| {
                let (client, base) = (client.clone(), base.clone());
                async move {
                    let request = Request::post(format!("{base}/api/v1.idempotency.{route}"))
                        .header("content-type", "application/msgpack")
                        .header("accept", "application/msgpack")
                        .header("authorization", format!("Bearer {TOKEN}"))
                        .body(Full::new(Bytes::from(body)))
                        .expect("a request");
                    let response = client.request(request).await.expect("the server answers");
                    assert!(
                        response.status().is_success(),
                        "{route}: {}",
                        response.status()
                    );
                    response
                        .into_body()
                        .collect()
                        .await
                        .expect("a body")
                        .to_bytes()
                }
            }
        };
        let start = |i: usize| {
            rmp_serde::to_vec_named(&Start {
                key: &format!("h{i}"),
                lock_period_ms: 30_000,
            })
            .expect("encodes")
        };
        let p = post.clone();
        let fresh_http = measure(ops, concurrency, move |i| {
            let p = p.clone();
            async move {
                p("start", start(i)).await;
                let key = format!("h{i}");
                let done = Complete {
                    key: &key,
                    response: b"ok",
                    ttl_ms: 86_400_000,
                };
                p("complete", rmp_serde::to_vec_named(&done).expect("encodes")).await;
            }
        })
        .await;
        let p = post.clone();
        let replay_http = measure(ops, concurrency, move |i| {
            let p = p.clone();
            async move {
                let body = p("start", start(i)).await;
                assert!(
                    body.windows(9).any(|w| w == b"completed"),
                    "h{i} did not replay"
                );
            }
        })
        .await;
        let name = format!("{:?}", parsed.scheme());
        row(&name, "start + complete", &fresh, &fresh_http);
        row(&name, "replay", &replay, &replay_http);
    }
    Ok(())
}
