//! `sluice worker`: joins a server over WebSocket, offers this machine's adapter, compiles
//! the stages it is given and computes their micro-batches, and reconnects with backoff
//! when the connection drops.

use crate::protocol::{self, TensorHeader, ToServer, ToWorker, PROTOCOL};
use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use sluice_engine::graph::{doc, Graph};
use sluice_engine::runtime::exec::{ExecOptions, GpuExecutable, TraceContext};
use sluice_engine::runtime::plan::{HalfStorage, Plan, PlanOptions, Precision};
use sluice_engine::runtime::GpuContext;
use sluice_engine::telemetry::now_ns;
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// Arguments of `sluice worker`.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The server, as ws://HOST:PORT (the path /api/workers is added).
    #[arg(long)]
    pub connect: String,
    /// The server's token.
    #[arg(long, env = "SLUICE_TOKEN")]
    pub token: Option<String>,
    /// Name shown by the server (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
}

/// How a connection ended.
enum End {
    /// The server refused the worker (for example, another protocol version).
    Refused(String),
    /// The connection closed; reconnect.
    Closed,
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Runs the worker until the server refuses it or the process is stopped.
pub fn worker(args: &WorkerArgs) -> Result<ExitCode> {
    let ctx = pollster::block_on(GpuContext::new()).context("the worker needs a GPU adapter")?;
    let adapters = pollster::block_on(sluice_engine::runtime::gpu::list_adapters());
    let name = args
        .name
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "worker".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut backoff = Duration::from_millis(500);
        loop {
            match connect_once(args, &name, &ctx, &adapters).await {
                Ok(End::Refused(e)) => bail!("the server refused this worker: {e}"),
                Ok(End::Closed) => {
                    eprintln!("sluice worker: the connection closed; reconnecting");
                    backoff = Duration::from_millis(500);
                }
                Err(e) => eprintln!(
                    "sluice worker: {e:#}; retrying in {:.1} s",
                    backoff.as_secs_f64()
                ),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    })
}

async fn send(socket: &mut Socket, msg: &ToServer) -> Result<()> {
    socket
        .send(Message::Text(serde_json::to_string(msg)?.into()))
        .await?;
    Ok(())
}

async fn connect_once(
    args: &WorkerArgs,
    name: &str,
    ctx: &GpuContext,
    adapters: &[sluice_engine::runtime::AdapterSummary],
) -> Result<End> {
    let base = args.connect.trim_end_matches('/');
    let url = if base.ends_with("/api/workers") {
        base.to_string()
    } else {
        format!("{base}/api/workers")
    };
    let mut req = url
        .as_str()
        .into_client_request()
        .with_context(|| format!("'{url}' is not a ws:// address"))?;
    if let Some(t) = &args.token {
        req.headers_mut()
            .insert("Authorization", format!("Bearer {t}").parse()?);
    }
    let (mut socket, _) = tokio_tungstenite::connect_async(req)
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    send(
        &mut socket,
        &ToServer::Hello {
            protocol: PROTOCOL,
            name: name.to_string(),
            adapters: adapters.to_vec(),
        },
    )
    .await?;
    let mut jobs: HashMap<String, GpuExecutable> = HashMap::new();
    while let Some(msg) = socket.next().await {
        let text = match msg? {
            Message::Text(t) => t.to_string(),
            Message::Close(_) => return Ok(End::Closed),
            Message::Ping(_) | Message::Pong(_) => continue,
            Message::Binary(_) | Message::Frame(_) => {
                bail!("unexpected binary frame from the server")
            }
        };
        match serde_json::from_str::<ToWorker>(&text)
            .context("unreadable message from the server")?
        {
            ToWorker::Welcome { worker } => eprintln!(
                "sluice worker: joined {url} as {worker} on {}",
                ctx.adapter.name
            ),
            ToWorker::Refused { error } => return Ok(End::Refused(error)),
            ToWorker::Load {
                job,
                graph,
                precision,
                stage,
            } => {
                let answer = match load(ctx, &graph, &precision, stage) {
                    Ok(exe) => {
                        jobs.insert(job.clone(), exe);
                        ToServer::Loaded { job }
                    }
                    Err(e) => ToServer::Error {
                        job: Some(job),
                        error: format!("{e:#}"),
                    },
                };
                send(&mut socket, &answer).await?;
            }
            ToWorker::Compute {
                job,
                micro_batch,
                inputs,
            } => {
                let mut tensors = HashMap::new();
                let mut bad = None;
                for h in &inputs {
                    let frame = match socket.next().await {
                        Some(Ok(Message::Binary(b))) => b,
                        _ => bail!("the server did not send the tensor '{}'", h.name),
                    };
                    match protocol::decode(h, &frame) {
                        Ok(t) => {
                            tensors.insert(h.name.clone(), t);
                        }
                        Err(e) => bad = Some(e),
                    }
                }
                let result = match (bad, jobs.get(&job)) {
                    (Some(e), _) => Err(e),
                    (None, None) => Err(format!("job '{job}' is not loaded here")),
                    (None, Some(exe)) => compute(exe, &job, micro_batch, &tensors),
                };
                match result {
                    Ok((outputs, events)) => {
                        let (headers, frames): (Vec<TensorHeader>, Vec<Vec<u8>>) =
                            protocol::encode(&outputs);
                        send(
                            &mut socket,
                            &ToServer::Result {
                                job,
                                micro_batch,
                                outputs: headers,
                                events,
                            },
                        )
                        .await?;
                        for f in frames {
                            socket.send(Message::Binary(f.into())).await?;
                        }
                    }
                    Err(error) => {
                        send(
                            &mut socket,
                            &ToServer::Error {
                                job: Some(job),
                                error,
                            },
                        )
                        .await?
                    }
                }
            }
            ToWorker::Unload { job } => {
                jobs.remove(&job);
            }
        }
    }
    Ok(End::Closed)
}

fn load(
    ctx: &GpuContext,
    graph: &serde_json::Value,
    precision: &str,
    stage: usize,
) -> Result<GpuExecutable> {
    let d = doc::decode_value(graph).map_err(|p| anyhow::anyhow!("bad stage graph: {p:?}"))?;
    let g = Graph::build(d).map_err(|p| anyhow::anyhow!("bad stage graph: {p}"))?;
    let precision =
        Precision::parse(precision).with_context(|| format!("unknown precision '{precision}'"))?;
    let half = if ctx.adapter.shader_f16 && precision == Precision::F16 {
        HalfStorage::Native
    } else {
        HalfStorage::Packed
    };
    let weights = sluice_engine::weights::init_weights(&g, g.doc.params.seed.unwrap_or(0));
    let plan = Plan::with_options(
        &g,
        PlanOptions {
            fuse: true,
            precision,
            half,
        },
    )?;
    let opts = ExecOptions {
        prefetch: 1,
        device: stage,
        stage,
    };
    Ok(pollster::block_on(GpuExecutable::with_options(
        ctx, plan, &weights, opts,
    ))?)
}

type Computed = (
    Vec<(String, sluice_engine::Tensor)>,
    Vec<sluice_engine::telemetry::Event>,
);

fn compute(
    exe: &GpuExecutable,
    job: &str,
    m: usize,
    inputs: &HashMap<String, sluice_engine::Tensor>,
) -> Result<Computed, String> {
    let trace = TraceContext {
        first_micro_batch: m,
        ..TraceContext::new(job, now_ns())
    };
    let mut r =
        pollster::block_on(exe.run_stream(std::slice::from_ref(inputs), &trace, &mut |_| {}))
            .map_err(|e| e.to_string())?;
    Ok((r.outputs.pop().unwrap_or_default(), r.events))
}
