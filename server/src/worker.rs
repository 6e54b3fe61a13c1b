//! `sluice worker`: joins a server over WebSocket, offers this machine's adapter (and its
//! calibrated rates), compiles the stage plans it is given and computes their
//! micro-batches through the engine's execution seam, and reconnects with backoff when
//! the connection drops.

use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use sluice_api::protocol::{self, TensorHeader, ToServer, ToWorker, PROTOCOL};
use sluice_engine::exec::device::{Executable, TraceContext};
use sluice_engine::gpu::{GpuContext, GpuExecutable};
use sluice_engine::plan::cost::Rates;
use sluice_engine::plan::Plan;
use sluice_engine::telemetry::now_ns;
use sluice_engine::weights::Weights;
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
    let adapters = pollster::block_on(sluice_engine::gpu::context::list_adapters());
    let rates = match crate::rates::rates_for(&ctx, false) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("sluice worker: calibration failed ({e:#}); the server will assume rates");
            None
        }
    };
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
            match connect_once(args, &name, &ctx, &adapters, rates).await {
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
    adapters: &[sluice_engine::gpu::AdapterSummary],
    rates: Option<Rates>,
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
            rates,
        },
    )
    .await?;
    let mut jobs: HashMap<String, (GpuExecutable, usize)> = HashMap::new();
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
                plan,
                weights,
                stage,
            } => {
                let mut tensors = Weights::new();
                let mut bad = None;
                for h in &weights {
                    let frame = match socket.next().await {
                        Some(Ok(Message::Binary(b))) => b,
                        _ => bail!("the server did not send the weight '{}'", h.name),
                    };
                    match protocol::decode(h, &frame) {
                        Ok(t) => {
                            tensors.insert(h.name.clone(), t);
                        }
                        Err(e) => bad = Some(e),
                    }
                }
                let loaded = match bad {
                    Some(e) => Err(anyhow::anyhow!(e)),
                    None => load(ctx, plan, &tensors),
                };
                let answer = match loaded {
                    Ok(exe) => {
                        jobs.insert(job.clone(), (exe, stage));
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
                let result = match (bad, jobs.get_mut(&job)) {
                    (Some(e), _) => Err(e),
                    (None, None) => Err(format!("job '{job}' is not loaded here")),
                    (None, Some((exe, stage))) => compute(exe, *stage, &job, micro_batch, &tensors),
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

/// Compiles a stage's plan with its weights on this worker's device.
fn load(ctx: &GpuContext, plan: serde_json::Value, weights: &Weights) -> Result<GpuExecutable> {
    let plan: Plan = serde_json::from_value(plan).context("the stage plan is not readable")?;
    Ok(pollster::block_on(GpuExecutable::compile(
        ctx, plan, weights, 1,
    ))?)
}

type Computed = (
    Vec<(String, sluice_engine::Tensor)>,
    Vec<sluice_engine::telemetry::Event>,
);

/// Computes one micro-batch; event times are relative to the request's arrival.
fn compute(
    exe: &mut GpuExecutable,
    stage: usize,
    job: &str,
    m: usize,
    inputs: &HashMap<String, sluice_engine::Tensor>,
) -> Result<Computed, String> {
    let trace = TraceContext {
        device: stage,
        stage,
        ..TraceContext::new(job, now_ns())
    };
    let mut events = Vec::new();
    exe.submit(m, inputs, &trace, &mut events)
        .map_err(|e| e.to_string())?;
    let (_, outs) =
        pollster::block_on(exe.complete(&trace, &mut events)).map_err(|e| e.to_string())?;
    let mut outs: Vec<(String, sluice_engine::Tensor)> = outs.into_iter().collect();
    outs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((outs, events))
}
