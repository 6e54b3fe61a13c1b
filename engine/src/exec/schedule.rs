//! Pipeline schedules: what each stage does, in order, as data its loop follows.
//!
//! Inference streams: every stage runs the forward pass of every micro-batch of the whole
//! dataset in order, so stage s works on micro-batch m while stage s+1 works on m−1 and the
//! pipeline fills and drains once per dataset, not once per batch. Its ideal bubble
//! fraction is (S−1)/(M+S−1) over all M micro-batches of the run.
//!
//! Training steps ([`TrainSchedule`]) add backward passes, which run from the last stage
//! to the first, and flush every step: all M micro-batches' gradients are summed before
//! the update. GPipe runs every forward, then every backward, so stage s stashes the
//! activations of all M micro-batches; 1F1B (PipeDream-flush) starts the backward pass of
//! micro-batch m as soon as it can, after S−s−1 warm-up forwards, so stage s holds at most
//! S−s. Both have the same ideal bubble, (S−1)/(M+S−1) when a backward costs a forward.

use serde::{Deserialize, Serialize};

/// One thing a stage does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// The forward pass of a micro-batch: its inputs come from the previous stage (or
    /// the dataset), its outputs go to the next stage (or the results).
    Forward(usize),
}

/// A pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// GPipe for inference, streaming micro-batches across batch boundaries.
    GPipe,
}

impl Schedule {
    /// The tasks of stage `stage` of `stages` over `micro_batches` micro-batches, in order.
    pub fn tasks(self, stage: usize, stages: usize, micro_batches: usize) -> Vec<Task> {
        let _ = (stage, stages);
        match self {
            Schedule::GPipe => (0..micro_batches).map(Task::Forward).collect(),
        }
    }

    /// The schedule's ideal bubble fraction with S stages and M micro-batches.
    pub fn ideal_bubble(self, stages: usize, micro_batches: usize) -> f64 {
        match self {
            Schedule::GPipe => crate::telemetry::metrics::gpipe_bubble(stages, micro_batches),
        }
    }
}

/// One thing a stage does in a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainTask {
    /// The forward pass of micro-batch m through the stage, stashing what its backward
    /// pass reads.
    Forward(usize),
    /// The backward pass of micro-batch m through the stage, releasing its stash.
    Backward(usize),
}

/// A pipeline schedule for training steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrainSchedule {
    /// One forward, one backward (PipeDream-flush): stashes bounded by the stage count.
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Every forward, then every backward: stashes of all M micro-batches.
    #[serde(rename = "gpipe")]
    GPipe,
}

impl TrainSchedule {
    /// The name users write (`1f1b`, `gpipe`).
    pub fn name(self) -> &'static str {
        match self {
            TrainSchedule::OneFOneB => "1f1b",
            TrainSchedule::GPipe => "gpipe",
        }
    }

    /// The tasks of stage `stage` of `stages` in a step of `micro_batches` micro-batches.
    pub fn tasks(self, stage: usize, stages: usize, micro_batches: usize) -> Vec<TrainTask> {
        let m = micro_batches;
        match self {
            TrainSchedule::GPipe => (0..m)
                .map(TrainTask::Forward)
                .chain((0..m).map(TrainTask::Backward))
                .collect(),
            TrainSchedule::OneFOneB => {
                let warm_up = stages.saturating_sub(stage + 1).min(m);
                let mut tasks: Vec<TrainTask> = (0..warm_up).map(TrainTask::Forward).collect();
                for k in 0..m - warm_up {
                    tasks.push(TrainTask::Forward(warm_up + k));
                    tasks.push(TrainTask::Backward(k));
                }
                tasks.extend((m - warm_up..m).map(TrainTask::Backward));
                tasks
            }
        }
    }

    /// The most micro-batches stage `stage` stashes at once.
    pub fn stash_bound(self, stage: usize, stages: usize, micro_batches: usize) -> usize {
        match self {
            TrainSchedule::GPipe => micro_batches,
            TrainSchedule::OneFOneB => stages.saturating_sub(stage).min(micro_batches),
        }
    }

    /// The ideal bubble fraction when every forward and every backward take one time unit
    /// each on every stage: (S−1)/(M+S−1) for both schedules.
    pub fn ideal_bubble(self, stages: usize, micro_batches: usize) -> f64 {
        crate::telemetry::metrics::gpipe_bubble(stages, micro_batches)
    }
}

impl std::str::FromStr for TrainSchedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "1f1b" => Ok(TrainSchedule::OneFOneB),
            "gpipe" => Ok(TrainSchedule::GPipe),
            other => Err(format!(
                "unknown training schedule '{other}' (1f1b or gpipe)"
            )),
        }
    }
}

/// The steps of a lock-step GPipe run (at step t, stage s runs micro-batch t − s): the
/// reference order the driver's streams follow when every stage takes equal time.
pub fn gpipe_steps(stages: usize, micro_batches: usize) -> Vec<Vec<(usize, usize)>> {
    if stages == 0 || micro_batches == 0 {
        return Vec::new();
    }
    (0..stages + micro_batches - 1)
        .map(|t| {
            (0..stages)
                .filter(|&s| t >= s && t - s < micro_batches)
                .map(|s| (s, t - s))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_step_order_respects_dependencies_and_has_the_ideal_bubble() {
        for s in 1..5 {
            for m in 1..9 {
                let steps = gpipe_steps(s, m);
                assert_eq!(steps.len(), s + m - 1);
                let mut when = vec![vec![usize::MAX; m]; s];
                for (t, step) in steps.iter().enumerate() {
                    for &(st, mb) in step {
                        assert_eq!(when[st][mb], usize::MAX, "({st},{mb}) scheduled twice");
                        when[st][mb] = t;
                    }
                }
                for st in 0..s {
                    for mb in 0..m {
                        let t = when[st][mb];
                        assert_ne!(t, usize::MAX, "({st},{mb}) never scheduled");
                        if st > 0 {
                            assert!(when[st - 1][mb] < t, "stage {st} ran {mb} too early");
                        }
                        if mb > 0 {
                            assert!(
                                when[st][mb - 1] < t,
                                "stage {st} ran {mb} before {}",
                                mb - 1
                            );
                        }
                    }
                }
                let busy: usize = steps.iter().map(Vec::len).sum();
                let idle = 1.0 - busy as f64 / (s * steps.len()) as f64;
                assert!((idle - Schedule::GPipe.ideal_bubble(s, m)).abs() < 1e-12);
            }
        }
    }

    /// Runs the tasks of every stage in lock step (each step, every stage whose next task
    /// has its inputs does it) and returns the stash peaks and the steps taken; fails on
    /// a deadlock or a task run before its inputs exist.
    fn simulate(schedule: TrainSchedule, s: usize, m: usize) -> (Vec<usize>, usize) {
        let tasks: Vec<Vec<TrainTask>> = (0..s).map(|st| schedule.tasks(st, s, m)).collect();
        let mut next = vec![0usize; s];
        let mut fwd_done = vec![vec![false; m]; s];
        let mut bwd_done = vec![vec![false; m]; s];
        let (mut stash, mut peak) = (vec![0usize; s], vec![0usize; s]);
        let mut steps = 0;
        while next.iter().zip(&tasks).any(|(n, t)| *n < t.len()) {
            steps += 1;
            assert!(
                steps <= 4 * (m + s) * 2,
                "{schedule:?} S={s} M={m} deadlocks"
            );
            let ready: Vec<usize> = (0..s)
                .filter(|&st| {
                    tasks[st].get(next[st]).is_some_and(|t| match *t {
                        TrainTask::Forward(k) => st == 0 || fwd_done[st - 1][k],
                        TrainTask::Backward(k) => {
                            fwd_done[st][k] && (st + 1 == s || bwd_done[st + 1][k])
                        }
                    })
                })
                .collect();
            for st in ready {
                match tasks[st][next[st]] {
                    TrainTask::Forward(k) => {
                        fwd_done[st][k] = true;
                        stash[st] += 1;
                        peak[st] = peak[st].max(stash[st]);
                    }
                    TrainTask::Backward(k) => {
                        bwd_done[st][k] = true;
                        stash[st] -= 1;
                    }
                }
                next[st] += 1;
            }
        }
        assert!(bwd_done.iter().flatten().all(|&d| d));
        (peak, steps)
    }

    #[test]
    fn training_schedules_run_every_pass_once_within_their_stash_bounds() {
        for schedule in [TrainSchedule::OneFOneB, TrainSchedule::GPipe] {
            for s in 1..5 {
                for m in 1..10 {
                    for st in 0..s {
                        let tasks = schedule.tasks(st, s, m);
                        assert_eq!(tasks.len(), 2 * m);
                        for k in 0..m {
                            let f = tasks.iter().position(|t| *t == TrainTask::Forward(k));
                            let b = tasks.iter().position(|t| *t == TrainTask::Backward(k));
                            assert!(f < b, "{schedule:?} stage {st}: micro-batch {k}");
                        }
                    }
                    let (peak, steps) = simulate(schedule, s, m);
                    for (st, &p) in peak.iter().enumerate() {
                        assert_eq!(
                            p,
                            schedule.stash_bound(st, s, m),
                            "{schedule:?} S={s} M={m}"
                        );
                    }
                    // In lock step with unit tasks, both take 2(M+S−1) steps: the ideal bubble.
                    assert_eq!(steps, 2 * (m + s - 1), "{schedule:?} S={s} M={m}");
                }
            }
        }
        assert_eq!("1f1b".parse(), Ok(TrainSchedule::OneFOneB));
        assert!("pipedream".parse::<TrainSchedule>().is_err());
    }

    #[test]
    fn every_stage_streams_every_micro_batch_in_order() {
        for stage in 0..3 {
            let tasks = Schedule::GPipe.tasks(stage, 3, 5);
            let order: Vec<usize> = tasks
                .iter()
                .map(|t| match t {
                    Task::Forward(m) => *m,
                })
                .collect();
            assert_eq!(order, vec![0, 1, 2, 3, 4]);
        }
    }
}
