//! Where edges and their labels go, from the nodes' rectangles alone (so a graph laid out
//! by hand routes as well as an automatic layout). Nodes whose heights overlap form a
//! band; between bands runs a channel with no node in it. An edge leaves its source's
//! bottom port downwards, crosses every band between its ends through a gap between that
//! band's nodes, and enters its target's top port from above; every bend lies inside a
//! channel, so an edge never passes through a node it does not connect. A label is placed
//! just above the port it enters, at the first nearby spot that overlaps no node and no
//! label placed before it.

/// Space kept between an edge and a node it passes.
const CLEARANCE: f64 = 10.0;
/// Least distance between two edges passing the same gap.
const EDGE_SPACING: f64 = 8.0;
/// The deepest an edge turning in a channel dips into it.
const TURN_DEPTH: f64 = 24.0;
/// Height of a label's box (10 px text).
const LABEL_HEIGHT: f64 = 12.0;
/// A generous width per character of a 10 px label, so estimated boxes contain drawn ones.
const LABEL_CHAR_WIDTH: f64 = 6.4;

/// An axis-aligned rectangle: x, y, width, height.
pub type Rect = [f64; 4];

/// Whether two rectangles overlap (touching edges do not count).
pub fn overlaps(a: Rect, b: Rect) -> bool {
    a[0] < b[0] + b[2] && b[0] < a[0] + a[2] && a[1] < b[1] + b[3] && b[1] < a[1] + a[3]
}

/// Rows of nodes with overlapping heights.
struct Band {
    top: f64,
    bottom: f64,
    /// Free x intervals between the band's nodes (with clearance), left to right; the
    /// first starts at -∞ and the last ends at +∞.
    free: Vec<(f64, f64)>,
    /// Where edges already pass.
    used: Vec<f64>,
}

/// One vertical stretch of an edge: at `x` from `enter` to `exit` (top to bottom when
/// `down`).
#[derive(Clone, Copy, Debug)]
struct Pass {
    x: f64,
    enter: f64,
    exit: f64,
    down: bool,
    band: usize,
}

/// Routes edges between the rectangles it was made with.
pub struct Router {
    bands: Vec<Band>,
    /// The band of every rectangle.
    band_of: Vec<usize>,
}

impl Router {
    /// Groups `rects` into bands and finds each band's gaps.
    pub fn new(rects: &[Rect]) -> Router {
        let mut order: Vec<usize> = (0..rects.len()).collect();
        order.sort_by(|&a, &b| rects[a][1].total_cmp(&rects[b][1]));
        let mut bands: Vec<Band> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut band_of = vec![0; rects.len()];
        for i in order {
            let r = rects[i];
            match bands.last_mut() {
                Some(b) if r[1] < b.bottom => b.bottom = b.bottom.max(r[1] + r[3]),
                _ => {
                    bands.push(Band {
                        top: r[1],
                        bottom: r[1] + r[3],
                        free: Vec::new(),
                        used: Vec::new(),
                    });
                    members.push(Vec::new());
                }
            }
            band_of[i] = bands.len() - 1;
            if let Some(m) = members.last_mut() {
                m.push(i);
            }
        }
        for (band, members) in bands.iter_mut().zip(&members) {
            let mut spans: Vec<(f64, f64)> = members
                .iter()
                .map(|&i| {
                    (
                        rects[i][0] - CLEARANCE,
                        rects[i][0] + rects[i][2] + CLEARANCE,
                    )
                })
                .collect();
            spans.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut free = Vec::new();
            let mut from = f64::NEG_INFINITY;
            for (l, r) in spans {
                if l > from {
                    free.push((from, l));
                }
                from = from.max(r);
            }
            free.push((from, f64::INFINITY));
            band.free = free;
        }
        Router { bands, band_of }
    }

    /// Where an edge passing band `b` near `want` goes: the nearest free x, moved along
    /// its gap away from edges already passing there.
    fn pass_x(&mut self, b: usize, want: f64) -> f64 {
        let band = &mut self.bands[b];
        let mut best = want;
        let mut best_cost = f64::INFINITY;
        for &(l, r) in &band.free {
            for k in 0..8u32 {
                let step = EDGE_SPACING * k.div_ceil(2) as f64;
                let try_x = if k % 2 == 0 { want + step } else { want - step };
                let x = try_x.clamp(l, r);
                let crowded = band.used.iter().any(|&u| (u - x).abs() < EDGE_SPACING);
                let cost = (x - want).abs() + if crowded { 1e6 } else { 0.0 };
                if cost < best_cost {
                    best_cost = cost;
                    best = x;
                }
            }
        }
        band.used.push(best);
        best
    }

    /// The depth an edge may turn in the channel below (`below`) or above band `b`.
    fn turn_depth(&self, b: usize, below: bool) -> f64 {
        let room = if below {
            self.bands.get(b + 1).map(|n| n.top - self.bands[b].bottom)
        } else {
            b.checked_sub(1)
                .map(|p| self.bands[b].top - self.bands[p].bottom)
        };
        room.map_or(TURN_DEPTH, |r| (r / 2.0).min(TURN_DEPTH))
    }

    /// The SVG path of an edge from output port `from` on rectangle `src` to input port
    /// `to` on rectangle `dst` (indices into the rectangles the router was made with).
    pub fn route(&mut self, from: [f64; 2], src: usize, to: [f64; 2], dst: usize) -> String {
        let (Some(&sb), Some(&db)) = (self.band_of.get(src), self.band_of.get(dst)) else {
            return String::new();
        };
        let mut passes = vec![Pass {
            x: from[0],
            enter: from[1],
            exit: self.bands[sb].bottom.max(from[1]),
            down: true,
            band: sb,
        }];
        let mut x = from[0];
        if db > sb {
            for b in sb + 1..db {
                x = self.pass_x(b, x);
                let band = &self.bands[b];
                passes.push(Pass {
                    x,
                    enter: band.top,
                    exit: band.bottom,
                    down: true,
                    band: b,
                });
            }
        } else {
            // Back up: through the source's own band and every band up to the target's.
            for b in (db..=sb).rev() {
                x = self.pass_x(b, x);
                let band = &self.bands[b];
                passes.push(Pass {
                    x,
                    enter: band.bottom,
                    exit: band.top,
                    down: false,
                    band: b,
                });
            }
        }
        passes.push(Pass {
            x: to[0],
            enter: self.bands[db].top.min(to[1]),
            exit: to[1],
            down: true,
            band: db,
        });
        let mut d = format!("M{:.1},{:.1}", from[0], from[1]);
        for (k, p) in passes.iter().enumerate() {
            if k > 0 {
                let q = passes[k - 1];
                // Bends stay inside the channel between the two passes; a turn back
                // (down then up, or up then down) dips into the channel beside the band.
                let mid = match (q.down, p.down) {
                    (true, false) => q.exit + self.turn_depth(q.band, true),
                    (false, true) => q.exit - self.turn_depth(q.band, false),
                    _ => (q.exit + p.enter) / 2.0,
                };
                d.push_str(&format!(
                    " C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
                    q.x, mid, p.x, mid, p.x, p.enter
                ));
            }
            if (p.exit - p.enter).abs() > 0.05 {
                d.push_str(&format!(" L{:.1},{:.1}", p.x, p.exit));
            }
        }
        d
    }
}

/// Places labels: each just above the input port it names, moved until it overlaps no
/// node and no label placed before it.
pub struct Labels<'a> {
    nodes: &'a [Rect],
    placed: Vec<Rect>,
}

impl<'a> Labels<'a> {
    /// Starts placing labels among `nodes`.
    pub fn new(nodes: &'a [Rect]) -> Labels<'a> {
        Labels {
            nodes,
            placed: Vec::new(),
        }
    }

    /// The estimated box of `text` drawn with its baseline's left end at `at`.
    pub fn text_box(text: &str, at: [f64; 2]) -> Rect {
        let width = text.chars().count() as f64 * LABEL_CHAR_WIDTH + 2.0;
        [at[0] - 1.0, at[1] - LABEL_HEIGHT + 2.0, width, LABEL_HEIGHT]
    }

    /// Where the label `text` of the edge entering input port `k` at `port` goes (its
    /// baseline's left end); the first free spot of a few beside and above the port, or
    /// the first of them when none is free.
    pub fn place(&mut self, text: &str, port: [f64; 2], k: usize) -> [f64; 2] {
        let width = Self::text_box(text, [0.0, 0.0])[2];
        let row = |n: usize| port[1] - 6.0 - LABEL_HEIGHT * n as f64;
        let first_row = k % 2;
        let mut spots = Vec::new();
        for n in [first_row, 1 - first_row, 2, 3] {
            spots.push([port[0] + 5.0, row(n)]);
            spots.push([port[0] - 5.0 - width, row(n)]);
        }
        let free = |at: &[f64; 2], placed: &[Rect]| {
            let b = Self::text_box(text, *at);
            !self.nodes.iter().any(|&n| overlaps(b, n)) && !placed.iter().any(|&p| overlaps(b, p))
        };
        let at = spots
            .iter()
            .copied()
            .find(|at| free(at, &self.placed))
            .unwrap_or(spots[0]);
        self.placed.push(Self::text_box(text, at));
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points along an SVG path made of M, L and C commands.
    fn sample(d: &str) -> Vec<[f64; 2]> {
        let nums = |s: &str| -> Vec<f64> {
            s.split([',', ' '])
                .filter(|t| !t.is_empty())
                .map(|t| t.parse().unwrap())
                .collect()
        };
        let mut at = [0.0, 0.0];
        let mut out = Vec::new();
        let mut rest = d;
        while let Some(cmd) = rest.chars().next() {
            let end = rest[1..]
                .find(['M', 'L', 'C'])
                .map_or(rest.len(), |e| e + 1);
            let v = nums(rest[1..end].trim());
            match cmd {
                'M' => at = [v[0], v[1]],
                'L' => {
                    for i in 0..=20 {
                        let t = i as f64 / 20.0;
                        out.push([at[0] + (v[0] - at[0]) * t, at[1] + (v[1] - at[1]) * t]);
                    }
                    at = [v[0], v[1]];
                }
                'C' => {
                    for i in 0..=40 {
                        let t = i as f64 / 40.0;
                        let u = 1.0 - t;
                        let f = |k: usize| {
                            u * u * u * at[k]
                                + 3.0 * u * u * t * v[k]
                                + 3.0 * u * t * t * v[2 + k]
                                + t * t * t * v[4 + k]
                        };
                        out.push([f(0), f(1)]);
                    }
                    at = [v[4], v[5]];
                }
                _ => panic!("unexpected command in {d}"),
            }
            rest = &rest[end..];
        }
        out
    }

    fn inside(p: [f64; 2], r: Rect) -> bool {
        p[0] > r[0] + 0.5
            && p[0] < r[0] + r[2] - 0.5
            && p[1] > r[1] + 0.5
            && p[1] < r[1] + r[3] - 0.5
    }

    fn assert_clear(d: &str, rects: &[Rect], ends: [usize; 2]) {
        for p in sample(d) {
            for (i, &r) in rects.iter().enumerate() {
                assert!(
                    ends.contains(&i) || !inside(p, r),
                    "{d} passes through {r:?} at {p:?}"
                );
            }
        }
    }

    #[test]
    fn an_edge_skipping_rows_goes_around_the_nodes_between() {
        // A column of four nodes; an edge from the first to the last.
        let rects: Vec<Rect> = (0..4)
            .map(|i| [0.0, i as f64 * 120.0, 176.0, 68.0])
            .collect();
        let mut router = Router::new(&rects);
        let d = router.route([88.0, 68.0], 0, [88.0, 360.0], 3);
        assert_clear(&d, &rects, [0, 3]);
        // A second skip edge takes its own lane.
        let d2 = router.route([88.0, 68.0], 0, [88.0, 360.0], 3);
        assert_ne!(d, d2);
        assert_clear(&d2, &rects, [0, 3]);
    }

    #[test]
    fn edges_going_up_or_sideways_turn_in_the_channels() {
        let rects: Vec<Rect> = vec![
            [0.0, 0.0, 176.0, 68.0],
            [0.0, 120.0, 176.0, 68.0],
            [220.0, 120.0, 176.0, 68.0],
            [0.0, 240.0, 176.0, 68.0],
        ];
        let mut router = Router::new(&rects);
        // From the bottom node back up to the top one.
        let up = router.route([88.0, 308.0], 3, [88.0, 0.0], 0);
        assert_clear(&up, &rects, [3, 0]);
        // Between two nodes of one row.
        let side = router.route([88.0, 188.0], 1, [308.0, 120.0], 2);
        assert_clear(&side, &rects, [1, 2]);
    }

    #[test]
    fn labels_avoid_nodes_and_each_other() {
        let nodes = vec![[0.0, 100.0, 176.0, 68.0], [0.0, 0.0, 176.0, 68.0]];
        let mut labels = Labels::new(&nodes);
        let a = labels.place("f32 [N, 64, 56, 56]", [60.0, 100.0], 0);
        let b = labels.place("f32 [N, 64, 56, 56]", [100.0, 100.0], 1);
        let c = labels.place("f32 [N, 64, 56, 56]", [60.0, 100.0], 0);
        let boxes: Vec<Rect> = [a, b, c]
            .iter()
            .map(|&at| Labels::text_box("f32 [N, 64, 56, 56]", at))
            .collect();
        for (i, x) in boxes.iter().enumerate() {
            assert!(!nodes.iter().any(|&n| overlaps(*x, n)), "{x:?}");
            assert!(!boxes[..i].iter().any(|&y| overlaps(*x, y)), "{boxes:?}");
        }
    }
}
