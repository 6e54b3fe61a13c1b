//! Stage partitioning: split nodes (in topological order) into S contiguous stages that
//! minimise the slowest stage, where a stage costs its nodes' compute plus the transfer of
//! the activations crossing its cuts. Dynamic programming, O(S·n²) (pins are checked in
//! constant time per candidate); pinned nodes stay in their stage.

use serde::{Deserialize, Serialize};

/// The chosen split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Partition {
    /// Stage of each node, in the order given.
    pub stage_of: Vec<usize>,
    /// Predicted cost of each stage.
    pub stage_costs: Vec<f64>,
    /// The largest stage cost (what the split minimises).
    pub bottleneck: f64,
}

/// Splits `n = compute.len()` nodes into `stages` contiguous non-empty stages.
///
/// `cut[j]` is the cost of moving the activations that cross a cut just before node j
/// (`cut[0]` and `cut[n]` are unused); `pins[i]` forces node i into a stage.
pub fn partition(
    compute: &[f64],
    cut: &[f64],
    stages: usize,
    pins: &[Option<usize>],
) -> Result<Partition, String> {
    let n = compute.len();
    if stages == 0 {
        return Err("at least one stage is needed".into());
    }
    if stages > n {
        return Err(format!(
            "{stages} stages for {n} operator nodes: each stage needs at least one node"
        ));
    }
    if cut.len() != n + 1 || pins.len() != n {
        return Err("internal: cut and pins must match the node count".into());
    }
    if let Some(p) = pins.iter().flatten().find(|&&p| p >= stages) {
        return Err(format!(
            "a node is pinned to stage {p}, but there are only {stages} stages"
        ));
    }
    let mut prefix = vec![0.0; n + 1];
    for i in 0..n {
        prefix[i + 1] = prefix[i] + compute[i];
    }
    let seg = |i: usize, j: usize| -> f64 {
        let mut c = prefix[j] - prefix[i];
        if i > 0 {
            c += cut[i];
        }
        if j < n {
            c += cut[j];
        }
        c
    };
    // blocked[k][j]: one past the last node before j pinned to a stage other than k, so
    // nodes i..j may form stage k exactly when i >= blocked[k][j].
    let blocked: Vec<Vec<usize>> = (0..stages)
        .map(|k| {
            let mut b = vec![0; n + 1];
            for j in 0..n {
                b[j + 1] = if pins[j].is_some_and(|s| s != k) {
                    j + 1
                } else {
                    b[j]
                };
            }
            b
        })
        .collect();
    let allowed = |k: usize, i: usize, j: usize| i >= blocked[k][j];
    // best[k][j]: best bottleneck placing nodes 0..j into stages 0..=k.
    let inf = f64::INFINITY;
    let mut best = vec![vec![inf; n + 1]; stages];
    let mut from = vec![vec![0usize; n + 1]; stages];
    for (j, b) in best[0].iter_mut().enumerate().skip(1) {
        if allowed(0, 0, j) {
            *b = seg(0, j);
        }
    }
    for k in 1..stages {
        for j in k + 1..=n {
            for i in k..j {
                if best[k - 1][i] == inf || !allowed(k, i, j) {
                    continue;
                }
                let v = best[k - 1][i].max(seg(i, j));
                if v < best[k][j] {
                    best[k][j] = v;
                    from[k][j] = i;
                }
            }
        }
    }
    if best[stages - 1][n] == inf {
        return Err(
            "the stage pins cannot be satisfied by contiguous stages in topological order".into(),
        );
    }
    let mut bounds = vec![n];
    let mut j = n;
    for k in (1..stages).rev() {
        j = from[k][j];
        bounds.push(j);
    }
    bounds.push(0);
    bounds.reverse();
    let mut stage_of = vec![0; n];
    let mut stage_costs = Vec::new();
    for k in 0..stages {
        for s in stage_of.iter_mut().take(bounds[k + 1]).skip(bounds[k]) {
            *s = k;
        }
        stage_costs.push(seg(bounds[k], bounds[k + 1]));
    }
    Ok(Partition {
        stage_of,
        stage_costs,
        bottleneck: best[stages - 1][n],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Every split by brute force: the best bottleneck.
    fn brute(compute: &[f64], cut: &[f64], stages: usize, pins: &[Option<usize>]) -> Option<f64> {
        let n = compute.len();
        let mut best: Option<f64> = None;
        // Choose stages-1 cut points among 1..n.
        let mut cuts = vec![0usize; stages - 1];
        fn rec(
            pos: usize,
            start: usize,
            n: usize,
            cuts: &mut Vec<usize>,
            f: &mut dyn FnMut(&[usize]),
        ) {
            if pos == cuts.len() {
                f(cuts);
                return;
            }
            for c in start..n {
                cuts[pos] = c;
                rec(pos + 1, c + 1, n, cuts, f);
            }
        }
        rec(0, 1, n, &mut cuts, &mut |cs: &[usize]| {
            let mut bounds = vec![0];
            bounds.extend_from_slice(cs);
            bounds.push(n);
            let mut worst: f64 = 0.0;
            for k in 0..stages {
                let (i, j) = (bounds[k], bounds[k + 1]);
                if pins[i..j].iter().any(|p| p.is_some_and(|s| s != k)) {
                    return;
                }
                let mut c: f64 = compute[i..j].iter().sum();
                if i > 0 {
                    c += cut[i];
                }
                if j < n {
                    c += cut[j];
                }
                worst = worst.max(c);
            }
            if best.is_none_or(|b| worst < b) {
                best = Some(worst);
            }
        });
        best
    }

    #[test]
    fn optimal_against_brute_force() {
        let mut rng = Rng::new(17);
        for _ in 0..300 {
            let n = 1 + rng.below(9) as usize;
            let stages = 1 + rng.below(n.min(4) as u64) as usize;
            let compute: Vec<f64> = (0..n).map(|_| (1 + rng.below(100)) as f64).collect();
            let cut: Vec<f64> = (0..=n).map(|_| rng.below(30) as f64).collect();
            let pins: Vec<Option<usize>> = (0..n)
                .map(|_| {
                    if rng.below(6) == 0 {
                        Some(rng.below(stages as u64) as usize)
                    } else {
                        None
                    }
                })
                .collect();
            let want = brute(&compute, &cut, stages, &pins);
            match partition(&compute, &cut, stages, &pins) {
                Ok(p) => {
                    let w = want.expect("DP found a split brute force did not");
                    assert!(
                        (p.bottleneck - w).abs() < 1e-9,
                        "dp {} vs brute {w}",
                        p.bottleneck
                    );
                    let worst = p.stage_costs.iter().cloned().fold(0.0, f64::max);
                    assert!((worst - p.bottleneck).abs() < 1e-9);
                    assert!(p
                        .stage_of
                        .windows(2)
                        .all(|w| w[0] <= w[1] && w[1] <= w[0] + 1));
                    assert_eq!(p.stage_of.last().copied(), Some(stages - 1));
                    for (i, pin) in pins.iter().enumerate() {
                        if let Some(s) = pin {
                            assert_eq!(p.stage_of[i], *s);
                        }
                    }
                }
                Err(_) => assert!(want.is_none(), "DP failed where brute force found {want:?}"),
            }
        }
    }

    #[test]
    fn balances_equal_work() {
        let p = partition(&[1.0; 8], &[0.0; 9], 2, &[None; 8]).unwrap();
        assert_eq!(p.stage_of, vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert!(partition(&[1.0; 2], &[0.0; 3], 3, &[None; 2]).is_err());
    }
}
