//! Pipeline schedules: what each stage does, in order. A schedule is data the one driver
//! (`super::driver`) follows; adding a schedule (1F1B for training) adds tasks, not a
//! driver.
//!
//! Inference streams: every stage runs the forward pass of every micro-batch of the whole
//! dataset in order, so stage s works on micro-batch m while stage s+1 works on m−1 and the
//! pipeline fills and drains once per dataset, not once per batch. Its ideal bubble
//! fraction is (S−1)/(M+S−1) over all M micro-batches of the run.

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
