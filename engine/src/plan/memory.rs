//! Memory planning: intermediate tensors share buffers by liveness. Storages (a tensor and
//! the views aliasing it) get lifetime intervals in pass order; a producer may write in
//! place over an input whose life ends at that pass; then storages are placed greedily,
//! largest first, into the best-fitting buffer whose other occupants' intervals do not
//! overlap. Inputs, weights and constants keep buffers of their own.

use serde::Serialize;

/// One storage (a tensor and the views aliasing it) to place, with its lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifetime {
    /// Bytes.
    pub size: u64,
    /// First pass that writes it (`None`: written before the first pass, e.g. an input).
    pub def: Option<usize>,
    /// Last pass that reads it (`usize::MAX`: read back after the run).
    pub last_use: usize,
    /// Placed in a buffer of its own (inputs, weights, constants).
    pub dedicated: bool,
}

/// The result of planning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryPlan {
    /// Buffer of each storage.
    pub buffer_of: Vec<usize>,
    /// Size of each buffer.
    pub buffers: Vec<u64>,
    /// Sum of buffer sizes: the planned peak.
    pub planned_bytes: u64,
    /// One buffer per storage: what no planning would allocate.
    pub naive_bytes: u64,
}

fn interval(s: &Lifetime) -> (usize, usize) {
    (s.def.unwrap_or(0), s.last_use)
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// Places storages into buffers. `in_place` lists (input storage, output storage) pairs
/// whose producer may overwrite its input: the pair then shares one buffer when the
/// input's life ends at the output's producing pass.
pub fn plan(storages: &[Lifetime], in_place: &[(usize, usize)]) -> MemoryPlan {
    let n = storages.len();
    // Merge in-place pairs into chains: each storage gets a representative.
    let mut rep: Vec<usize> = (0..n).collect();
    fn find(rep: &mut [usize], x: usize) -> usize {
        let mut r = x;
        while rep[r] != r {
            r = rep[r];
        }
        rep[x] = r;
        r
    }
    let mut group_interval: Vec<(usize, usize)> = storages.iter().map(interval).collect();
    let mut group_size: Vec<u64> = storages.iter().map(|s| s.size).collect();
    for &(input, output) in in_place {
        if input >= n || output >= n || storages[input].dedicated || storages[output].dedicated {
            continue;
        }
        let (ri, ro) = (find(&mut rep, input), find(&mut rep, output));
        if ri == ro {
            continue;
        }
        // Only when the input's whole group dies exactly where the output is produced.
        let Some(def) = storages[output].def else {
            continue;
        };
        if group_interval[ri].1 != def || group_interval[ro].0 != def {
            continue;
        }
        rep[ro] = ri;
        group_interval[ri] = (
            group_interval[ri].0,
            group_interval[ri].1.max(group_interval[ro].1),
        );
        group_size[ri] = group_size[ri].max(group_size[ro]);
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| find(&mut rep, i) == i).collect();
    order.sort_by_key(|&g| (storages[g].dedicated, std::cmp::Reverse(group_size[g]), g));
    let mut buffers: Vec<u64> = Vec::new();
    let mut occupants: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut buffer_of_group = vec![usize::MAX; n];
    for &g in &order {
        let iv = group_interval[g];
        let size = group_size[g];
        let mut best: Option<usize> = None;
        if !storages[g].dedicated {
            for (b, occ) in occupants.iter().enumerate() {
                if occ.is_empty() || buffers[b] < size || occ.iter().any(|&o| overlaps(o, iv)) {
                    continue;
                }
                if best.is_none_or(|x| buffers[b] < buffers[x]) {
                    best = Some(b);
                }
            }
        }
        let b = best.unwrap_or_else(|| {
            buffers.push(size);
            occupants.push(Vec::new());
            buffers.len() - 1
        });
        if !storages[g].dedicated {
            occupants[b].push(iv);
        } else {
            // A dedicated buffer never takes other occupants: it is busy for the whole run.
            occupants[b].push((0, usize::MAX));
        }
        buffer_of_group[g] = b;
    }
    let buffer_of: Vec<usize> = (0..n).map(|i| buffer_of_group[find(&mut rep, i)]).collect();
    MemoryPlan {
        planned_bytes: buffers.iter().sum(),
        naive_bytes: storages.iter().map(|s| s.size).sum(),
        buffer_of,
        buffers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn st(size: u64, def: usize, last: usize) -> Lifetime {
        Lifetime {
            size,
            def: Some(def),
            last_use: last,
            dedicated: false,
        }
    }

    #[test]
    fn chain_reuses_two_buffers() {
        // a -> b -> c -> d: each lives from its pass to the next.
        let s = vec![
            st(100, 0, 1),
            st(100, 1, 2),
            st(100, 2, 3),
            st(100, 3, usize::MAX),
        ];
        let p = plan(&s, &[]);
        assert_eq!(p.buffers.len(), 2);
        assert_eq!(p.planned_bytes, 200);
        assert_eq!(p.naive_bytes, 400);
        let p = plan(&s, &[(0, 1), (1, 2), (2, 3)]);
        assert_eq!(p.buffers.len(), 1, "in place along the chain");
    }

    #[test]
    fn random_lifetimes_never_share_a_live_buffer() {
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let n = 1 + rng.below(30) as usize;
            let s: Vec<Lifetime> = (0..n)
                .map(|_| {
                    let def = rng.below(20) as usize;
                    let last = if rng.below(5) == 0 {
                        usize::MAX
                    } else {
                        def + rng.below(10) as usize
                    };
                    Lifetime {
                        size: 4 * (1 + rng.below(1000)),
                        def: Some(def),
                        last_use: last,
                        dedicated: rng.below(6) == 0,
                    }
                })
                .collect();
            let p = plan(&s, &[]);
            for i in 0..n {
                assert!(p.buffers[p.buffer_of[i]] >= s[i].size);
                for j in i + 1..n {
                    if p.buffer_of[i] == p.buffer_of[j] {
                        assert!(!s[i].dedicated && !s[j].dedicated);
                        assert!(
                            !overlaps(interval(&s[i]), interval(&s[j])),
                            "{:?} and {:?} share",
                            s[i],
                            s[j]
                        );
                    }
                }
            }
            assert!(p.planned_bytes <= p.naive_bytes);
        }
    }
}
