//! The one stage-pipeline driver. Every way of running a compiled graph — one device or
//! S stages, native threads or a browser's one thread, local devices or remote workers —
//! goes through [`drive`]: a feeder cuts micro-batches from the dataset, each stage loop
//! follows its schedule's tasks on its [`Executable`], and a collector hands each
//! micro-batch's values on, in order.
//!
//! Stages talk through bounded channels carrying a micro-batch's values (keyed by value
//! reference), so a stage never runs more than its prefetch slots ahead of the next. A
//! stage keeps up to [`Executable::capacity`] micro-batches in flight: while one computes
//! it starts the next whenever its inputs have arrived, so uploads hide under compute.
//! Native runs give each stage a thread (each device's waits block only that thread);
//! browser runs poll every loop on the page's one thread, each await yielding to the
//! others. The loops are the same code either way.

use super::device::{Executable, TraceContext};
use super::input::{Input, Inputs};
use super::schedule::{Schedule, Task};
use crate::error::RunError;
use crate::telemetry::Event;
use futures_channel::mpsc;
use futures_util::future::LocalBoxFuture;
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// How the stage loops run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concurrency {
    /// A thread per stage (native only).
    ThreadPerStage,
    /// Every loop polled on the calling thread (browsers; also works natively).
    OneThread,
}

/// One stage of a run: its executable and how its values map to the run's.
pub struct StageRun<'a> {
    /// The compiled stage.
    pub exe: &'a mut dyn Executable,
    /// (input name in the stage's plan, value key in the run) for each plan input.
    pub inputs: &'a [(String, String)],
    /// Value keys the run still needs after this stage (later stages' inputs and graph
    /// outputs); everything else is dropped from the micro-batch's values here.
    pub keep: &'a [String],
    /// How its events are labelled.
    pub trace: TraceContext<'a>,
}

/// A micro-batch's values (some may be samples borrowed from the dataset, which lives
/// for `'d`).
type Message<'d> = Result<(usize, Inputs<'d>), RunError>;

/// A stage loop's parts: the stage, its index, its tasks, its input and output channels.
type StageLoop<'a, 'd> = (
    StageRun<'a>,
    usize,
    Vec<Task>,
    mpsc::Receiver<Message<'d>>,
    mpsc::Sender<Message<'d>>,
);

/// A micro-batch source: cuts micro-batch `m` of the dataset.
pub type Source<'d> = dyn Fn(usize) -> Result<Inputs<'d>, RunError> + Sync + 'd;

/// Feeds micro-batches 0..count into the first stage, stopping when cancelled or when
/// the first stage stops listening.
async fn feed<'d>(
    count: usize,
    source: &Source<'d>,
    mut tx: mpsc::Sender<Message<'d>>,
    cancel: Option<&AtomicBool>,
) {
    for m in 0..count {
        let msg = if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            Err(RunError::Cancelled)
        } else {
            source(m).map(|values| (m, values))
        };
        let stop = msg.is_err();
        if tx.send(msg).await.is_err() || stop {
            return;
        }
    }
}

/// What a stage's next input is.
enum Next<'d> {
    Ready(Message<'d>),
    NotYet,
    Closed,
}

/// One stage: follows its tasks, keeping up to `capacity` micro-batches in flight, and
/// forwards each completed micro-batch's values downstream. Errors (its own or from
/// upstream) are forwarded downstream, where the collector reports the first.
async fn stage_loop<'d>(
    stage: StageRun<'_>,
    index: usize,
    tasks: Vec<Task>,
    mut rx: mpsc::Receiver<Message<'d>>,
    mut tx: mpsc::Sender<Message<'d>>,
) -> Vec<Event> {
    let StageRun {
        exe,
        inputs,
        keep,
        trace,
    } = stage;
    let mut events = Vec::new();
    let mut stash: HashMap<usize, Inputs<'d>> = HashMap::new();
    let mut tasks = tasks.into_iter().peekable();
    let mut in_flight = 0usize;
    let capacity = exe.capacity().max(1);
    let fail = |e: RunError| match e {
        RunError::Cancelled | RunError::Op { .. } | RunError::Stage { .. } => e,
        other => RunError::Stage {
            stage: index,
            message: other.to_string(),
        },
    };
    loop {
        if in_flight < capacity && tasks.peek().is_some() {
            let next = if in_flight == 0 {
                match rx.next().await {
                    Some(msg) => Next::Ready(msg),
                    None => Next::Closed,
                }
            } else {
                match rx.try_recv() {
                    Ok(msg) => Next::Ready(msg),
                    Err(mpsc::TryRecvError::Closed) => Next::Closed,
                    Err(_) => Next::NotYet,
                }
            };
            match next {
                Next::Ready(Ok((m, values))) => {
                    let expected = tasks.next();
                    if expected != Some(Task::Forward(m)) {
                        let _ = tx
                            .send(Err(RunError::Internal(format!(
                                "stage {index} received micro-batch {m} but its schedule expected {expected:?}"
                            ))))
                            .await;
                        return events;
                    }
                    let mut values = values;
                    // Values no later stage or output needs move to the stage uncopied.
                    let picked: Inputs<'d> = inputs
                        .iter()
                        .filter_map(|(name, key)| {
                            let shared = keep.contains(key)
                                || inputs.iter().filter(|(_, k)| k == key).count() > 1;
                            let t = if shared {
                                values.get(key).cloned()
                            } else {
                                values.remove(key)
                            };
                            t.map(|t| (name.clone(), t))
                        })
                        .collect();
                    if let Err(e) = exe.submit(m, picked, &trace, &mut events) {
                        let _ = tx.send(Err(fail(e))).await;
                        return events;
                    }
                    stash.insert(m, values);
                    in_flight += 1;
                    continue;
                }
                Next::Ready(Err(e)) => {
                    // Upstream failed or was cancelled: finish what is in flight, pass
                    // the error on.
                    for _ in 0..in_flight {
                        let _ = exe.complete(&trace, &mut events).await;
                    }
                    let _ = tx.send(Err(e)).await;
                    return events;
                }
                Next::Closed if in_flight == 0 => {
                    let _ = tx
                        .send(Err(RunError::Internal(format!(
                            "stage {index}: its input stopped before the run's end"
                        ))))
                        .await;
                    return events;
                }
                Next::Closed | Next::NotYet => {}
            }
        }
        if in_flight == 0 {
            return events;
        }
        match exe.complete(&trace, &mut events).await {
            Ok((m, outs)) => {
                in_flight -= 1;
                let mut values = stash.remove(&m).unwrap_or_default();
                values.extend(outs.into_iter().map(|(k, t)| (k, Input::Owned(t))));
                values.retain(|k, _| keep.contains(k));
                if tx.send(Ok((m, values))).await.is_err() {
                    // Downstream stopped (it failed): nothing more to do.
                    return events;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(fail(e))).await;
                return events;
            }
        }
    }
}

/// Receives every micro-batch's values from the last stage, in order, and hands them to
/// `sink`; the first error of any stage ends the run with that error.
async fn collect<'d>(
    count: usize,
    mut rx: mpsc::Receiver<Message<'d>>,
    sink: &mut dyn FnMut(usize, Inputs<'d>) -> Result<(), RunError>,
) -> Result<(), RunError> {
    for expected in 0..count {
        match rx.next().await {
            Some(Ok((m, values))) if m == expected => sink(m, values)?,
            Some(Ok((m, _))) => {
                return Err(RunError::Internal(format!(
                    "micro-batch {m} arrived where {expected} was due"
                )))
            }
            Some(Err(e)) => return Err(e),
            None => return Err(RunError::Internal("a pipeline stage stopped".into())),
        }
    }
    Ok(())
}

/// Runs `count` micro-batches cut by `source` through `stages` under `schedule`, handing
/// each micro-batch's remaining values to `sink` in order. Returns every stage's events.
/// When `cancel` is set, no further micro-batch starts and the run ends `Cancelled`.
pub async fn drive<'d>(
    stages: Vec<StageRun<'_>>,
    schedule: Schedule,
    count: usize,
    source: &Source<'d>,
    sink: &mut dyn FnMut(usize, Inputs<'d>) -> Result<(), RunError>,
    cancel: Option<&AtomicBool>,
    concurrency: Concurrency,
) -> Result<Vec<Event>, RunError> {
    let s_count = stages.len();
    if s_count == 0 {
        return Err(RunError::Internal("a run needs at least one stage".into()));
    }
    // Channel k feeds stage k (k = S: the collector). A channel holds as many messages
    // as its receiver has slots, so no stage runs far ahead of the next.
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for k in 0..=s_count {
        let room = stages.get(k).map_or(1, |s| s.exe.capacity().max(1));
        let (tx, rx) = mpsc::channel::<Message<'d>>(room);
        senders.push(tx);
        receivers.push(rx);
    }
    let mut receivers = receivers.into_iter();
    let mut senders = senders.into_iter();
    let feeder_tx = senders.next();
    let mut loops: Vec<StageLoop<'_, 'd>> = Vec::new();
    for (index, stage) in stages.into_iter().enumerate() {
        let (Some(rx), Some(tx)) = (receivers.next(), senders.next()) else {
            return Err(RunError::Internal("pipeline channels".into()));
        };
        let tasks = schedule.tasks(index, s_count, count);
        loops.push((stage, index, tasks, rx, tx));
    }
    let (Some(feeder_tx), Some(out_rx)) = (feeder_tx, receivers.next()) else {
        return Err(RunError::Internal("pipeline channels".into()));
    };
    match concurrency {
        #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
        Concurrency::ThreadPerStage => {
            let (result, events) = std::thread::scope(|scope| {
                let feeder =
                    scope.spawn(move || pollster::block_on(feed(count, source, feeder_tx, cancel)));
                let handles: Vec<_> = loops
                    .into_iter()
                    .map(|(stage, index, tasks, rx, tx)| {
                        scope.spawn(move || {
                            pollster::block_on(stage_loop(stage, index, tasks, rx, tx))
                        })
                    })
                    .collect();
                let result = pollster::block_on(collect(count, out_rx, sink));
                let mut events = Vec::new();
                let mut panicked = feeder.join().is_err();
                for h in handles {
                    match h.join() {
                        Ok(mut e) => events.append(&mut e),
                        Err(_) => panicked = true,
                    }
                }
                let result = match (result, panicked) {
                    (Ok(()), true) => Err(RunError::Internal("a pipeline stage panicked".into())),
                    (r, _) => r,
                };
                (result, events)
            });
            result.map(|()| events)
        }
        #[cfg(not(all(feature = "native", not(target_arch = "wasm32"))))]
        Concurrency::ThreadPerStage => Err(RunError::Unsupported(
            "a thread per stage needs the engine's native feature (use one thread)".into(),
        )),
        Concurrency::OneThread => {
            let mut result = Ok(());
            let mut futures: Vec<LocalBoxFuture<'_, Vec<Event>>> = Vec::new();
            futures.push(Box::pin(async move {
                feed(count, source, feeder_tx, cancel).await;
                Vec::new()
            }));
            for (stage, index, tasks, rx, tx) in loops {
                futures.push(Box::pin(stage_loop(stage, index, tasks, rx, tx)));
            }
            let collector: LocalBoxFuture<'_, Vec<Event>> = Box::pin(async {
                result = collect(count, out_rx, sink).await;
                Vec::new()
            });
            futures.push(collector);
            let events: Vec<Event> = futures_util::future::join_all(futures)
                .await
                .into_iter()
                .flatten()
                .collect();
            result.map(|()| events)
        }
    }
}
