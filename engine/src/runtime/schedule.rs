//! The GPipe schedule for inference: stage s works on micro-batch m at step s + m, so
//! stage s+1 runs micro-batch m-1 while stage s runs m. With S stages and M micro-batches
//! the ideal bubble fraction is (S−1)/(M+S−1).

/// Steps of the schedule: at each step, the (stage, micro-batch) pairs that run.
pub fn gpipe(stages: usize, micro_batches: usize) -> Vec<Vec<(usize, usize)>> {
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

/// The ideal GPipe bubble fraction (S−1)/(M+S−1).
pub fn ideal_bubble(stages: usize, micro_batches: usize) -> f64 {
    if stages == 0 || micro_batches == 0 {
        return 0.0;
    }
    (stages - 1) as f64 / (micro_batches + stages - 1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_respects_dependencies_and_has_the_ideal_bubble() {
        for s in 1..5 {
            for m in 1..9 {
                let steps = gpipe(s, m);
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
                            assert!(
                                when[st - 1][mb] < t,
                                "stage {st} ran {mb} before stage {} did",
                                st - 1
                            );
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
                // Busy slots / total slots = 1 - ideal bubble.
                let busy: usize = steps.iter().map(Vec::len).sum();
                let idle = 1.0 - busy as f64 / (s * steps.len()) as f64;
                assert!((idle - ideal_bubble(s, m)).abs() < 1e-12);
            }
        }
    }
}
