//! A machine's graph drawn as SVG, without a diagram library: the admin page has no
//! internet and no JavaScript libraries, so it inserts this markup inline.
//!
//! The markup is a contract: the page's styles and its browser tests find states and
//! edges by class and `data-` attributes (see [`MachineGraph::svg_with`]).
//!
//! The layout is layered, top to bottom: a state's layer is its distance from an initial
//! state along declared edges. Edges to a deeper layer go straight down; edges back up
//! (and down past other states) go around the right side, undo arrows around the left,
//! so the three never share a side.

use super::graph::{MachineGraph, PathOnGraph, StateNode};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::{self, Write};

/// Height of every state's box.
const NODE_H: f64 = 36.0;
/// Box width per character of a name: generous for a 13px sans-serif font, so that the
/// name fits whatever font the viewer picks.
const CHAR_W: f64 = 8.0;
/// Box width around the name, and the narrowest box.
const NODE_PAD: f64 = 24.0;
const NODE_MIN_W: f64 = 90.0;
/// Corner radius of a state's box.
const NODE_RX: f64 = 8.0;
/// Distance between the tops of consecutive layers (a 44px gap between boxes).
const ROW_PITCH: f64 = 80.0;
/// Gap between neighbours in a layer.
const NODE_GAP: f64 = 40.0;
/// Distance from the outermost box of the rows a side route passes to its vertical
/// (the lane): clears self-loops, which stick out 26px.
const LANE_BASE: f64 = 36.0;
/// Distance between the lanes of side routes that pass the same rows.
const LANE_GAP: f64 = 14.0;
/// Where in the gap between rows side routes run when they cannot leave or enter a box
/// sideways (another box is in the way): the first this far below the upper row, the
/// next ones [`CHANNEL_STEP`] further, so that they do not run on top of each other.
const CHANNEL: f64 = 10.0;
const CHANNEL_STEP: f64 = 6.0;
/// How many channels fit in a gap before they are reused.
const CHANNELS: usize = 5;
/// Corner radius of side routes.
const CORNER: f64 = 8.0;
/// Side routes leave a box's side this far from its middle, towards where they go, and
/// enter it [`ENTRY_OFFSET`] from its middle, on the side they come from: a route
/// arriving and one leaving never share a y, and in a chain of undo arrows the one
/// leaving turns away before the one arriving, so they do not cross.
const EXIT_OFFSET: f64 = 10.0;
const ENTRY_OFFSET: f64 = 4.0;
/// Side routes leave and enter a box's top or bottom this far from its corner.
const CORNER_PORT: f64 = 14.0;
/// Height of the curve joining two states of one layer.
const ARC_H: f64 = 28.0;
/// Width the ends of straight edges may spread over on a box's top or bottom, per edge.
const PORT_STEP: f64 = 16.0;
/// Start dot above an initial state: its radius and its distance above the box.
const START_R: f64 = 5.0;
const START_GAP: f64 = 26.0;
/// Width of one character of an undo label (11px), to keep the label inside the picture.
const LABEL_CHAR_W: f64 = 6.5;
/// Height of an undo label's line, for keeping labels apart.
const LABEL_H: f64 = 13.0;
/// Empty space around the drawing.
const MARGIN: f64 = 12.0;

/// The colours, by class, so the page (and a test) can rely on the classes alone. Every
/// rule is scoped to `.procflow-diagram`: inline in HTML, a `<style>` applies to the
/// whole page. Later rules win, like `mermaid_with`'s later classes.
pub(crate) const STYLE: &str = "\
.procflow-diagram{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:13px}
.procflow-diagram .state rect{fill:#fff;stroke:#666;stroke-width:1.2px}
.procflow-diagram .state text{fill:#222}
.procflow-diagram .state.rollback rect{fill:#fde2e2;stroke:#c0392b}
.procflow-diagram .state.no_rollback rect{fill:#e0e0e0;stroke:#555}
.procflow-diagram .state.visited rect{fill:#d8f0d8;stroke:#2e7d32}
.procflow-diagram .state.undone rect{fill:#fbe9e7;stroke:#c0392b;stroke-dasharray:4 2}
.procflow-diagram .state.current rect{fill:#fff3b0;stroke:#d4a000;stroke-width:3px}
.procflow-diagram .state rect.inner{fill:none;stroke-width:1px}
.procflow-diagram .pnr{fill:#555}
.procflow-diagram .start{fill:#333}
.procflow-diagram .start-arrow{fill:none;stroke:#333;stroke-width:1.3px}
.procflow-diagram .edge{fill:none;stroke:#8a8a8a;stroke-width:1.3px}
.procflow-diagram .edge.taken{stroke:#333;stroke-width:2.6px}
.procflow-diagram .undo{fill:none;stroke:#c0392b;stroke-width:1.6px;stroke-dasharray:6 3}
.procflow-diagram .undo-label{fill:#c0392b;font-size:11px;font-weight:600;\
paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
";

/// Arrowheads: markers take no colour from their path, so undo arrows have their own.
/// Sized in user units, so a thick taken edge does not get a huge head.
const DEFS: &str = "<defs>\
<marker id=\"pf-arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"9\" \
markerHeight=\"9\" markerUnits=\"userSpaceOnUse\" orient=\"auto\">\
<path d=\"M0,0L10,5L0,10z\" fill=\"#444\"/></marker>\
<marker id=\"pf-arrow-undo\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"9\" \
markerHeight=\"9\" markerUnits=\"userSpaceOnUse\" orient=\"auto\">\
<path d=\"M0,0L10,5L0,10z\" fill=\"#c0392b\"/></marker>\
</defs>\n";

impl MachineGraph {
    /// The graph drawn as a standalone SVG document: [`svg_with`](Self::svg_with) with
    /// no procedure on it (no state current, visited or undone; no undo arrows).
    #[must_use]
    pub fn svg(&self) -> String {
        self.svg_with(&PathOnGraph::default())
    }

    /// The graph drawn as a standalone SVG document (no XML declaration, so it can also
    /// go inline into HTML) with a procedure's path on it, coloured like
    /// [`mermaid_with`](Self::mermaid_with).
    ///
    /// The structure is a contract for pages and their tests:
    ///
    /// - The root is `<svg class="procflow-diagram" role="img" ...>`, titled with the
    ///   machine's name; its `<style>` colours everything by class, and its ids start
    ///   with `pf-`.
    /// - Each state is `<g class="state ..." data-state="NAME">` holding a `<rect>` and a
    ///   `<text>`. Its classes: `initial`, `terminal`, `rollback`, `no_rollback` from
    ///   the graph, and at most one of `current`, `undone`, `visited` from the path (in
    ///   that precedence). One state at most is `current`.
    /// - Each declared transition is `<path class="edge" data-from="A" data-to="B">`,
    ///   with the class `taken` if the procedure went that way (consecutive states of
    ///   `visited` then `current`).
    /// - While rolling back, each step still to undo is `<path class="undo"
    ///   data-from="A" data-to="B" data-step="N">` followed by `<text
    ///   class="undo-label">undo N</text>`.
    ///
    /// Names the graph does not know (in edges or in the path) are left out.
    ///
    /// # Examples
    ///
    /// ```
    /// use procflow::operator::{MachineGraph, PathOnGraph, StateNode};
    ///
    /// let state = |name: &str, initial, terminal| StateNode {
    ///     name: name.to_owned(),
    ///     initial,
    ///     terminal,
    ///     rollback: false,
    ///     no_rollback: false,
    /// };
    /// let graph = MachineGraph {
    ///     name: "Job".to_owned(),
    ///     states: vec![state("Start", true, false), state("Done", false, true)],
    ///     edges: vec![("Start".to_owned(), "Done".to_owned())],
    /// };
    /// let path = PathOnGraph {
    ///     current: "Done".into(),
    ///     visited: vec!["Start".into()],
    ///     ..PathOnGraph::default()
    /// };
    /// let svg = graph.svg_with(&path);
    /// assert!(svg.contains(r#"<g class="state terminal current" data-state="Done">"#));
    /// assert!(svg.contains(r#"<path class="edge taken" data-from="Start" data-to="Done""#));
    /// ```
    #[must_use]
    pub fn svg_with(&self, path: &PathOnGraph) -> String {
        let resolved = Resolved::new(self);
        let layout = Layout::new(self, &resolved.edges);
        let marks = Marks::new(&resolved, path);
        let mut bounds = Bounds::default();
        for (rect, state) in layout.boxes.iter().zip(&self.states) {
            bounds.include_rect(*rect);
            if state.initial {
                bounds.include(rect.cx(), rect.y - START_GAP - START_R);
            }
        }
        let mut channels = Channels::default();
        let edges = route_edges(&layout, &resolved.edges, &mut bounds, &mut channels);
        let undos = route_undos(&layout, &marks.undo, &mut bounds, &mut channels);
        render(self, &layout, &marks, &edges, &undos, &bounds)
    }
}

/// The graph with names resolved to indices into its states: the first state of a name
/// wins, and edges naming an unknown state are dropped.
struct Resolved<'g> {
    by_name: HashMap<&'g str, usize>,
    edges: Vec<(usize, usize)>,
}

impl<'g> Resolved<'g> {
    fn new(graph: &'g MachineGraph) -> Self {
        let mut by_name = HashMap::new();
        for (i, state) in graph.states.iter().enumerate() {
            by_name.entry(state.name.as_str()).or_insert(i);
        }
        let edges = graph.edges.iter().filter_map(|(from, to)| {
            Some((*by_name.get(from.as_str())?, *by_name.get(to.as_str())?))
        });
        let edges = edges.collect();
        Self { by_name, edges }
    }

    fn get(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

/// A procedure's path resolved against the graph; names it does not know are ignored.
struct Marks {
    current: Option<usize>,
    visited: HashSet<usize>,
    undone: HashSet<usize>,
    /// Transitions the procedure took.
    taken: HashSet<(usize, usize)>,
    /// Undo arrows: `(number, from, to)`.
    undo: Vec<(usize, usize, usize)>,
}

impl Marks {
    fn new(resolved: &Resolved<'_>, path: &PathOnGraph) -> Self {
        // `PathOnGraph::default()` (an empty name) means no procedure.
        let current = Some(path.current.as_str()).filter(|name| !name.is_empty());
        let resolve_all = |names: &[String]| names.iter().filter_map(|n| resolved.get(n)).collect();
        let mut walk: Vec<Option<usize>> = path.visited.iter().map(|n| resolved.get(n)).collect();
        walk.push(current.and_then(|n| resolved.get(n)));
        let taken = walk
            .windows(2)
            .filter_map(|pair| Some((pair[0]?, pair[1]?)));
        Self {
            current: current.and_then(|n| resolved.get(n)),
            visited: resolve_all(&path.visited),
            undone: resolve_all(&path.undone),
            taken: taken.collect(),
            undo: undo_steps(resolved, path),
        }
    }

    /// The classes a state's group gets from the path: one at most, because in
    /// `mermaid_with` the later class wins (current over undone over visited).
    fn place(&self, state: usize) -> Option<&'static str> {
        if self.current == Some(state) {
            Some("current")
        } else if self.undone.contains(&state) {
            Some("undone")
        } else if self.visited.contains(&state) {
            Some("visited")
        } else {
            None
        }
    }
}

/// The undo arrows as `mermaid_with` draws them: current to the first state to undo,
/// then on through the list; a step from a state to itself is no arrow but keeps its
/// number, and so does a step naming an unknown state.
fn undo_steps(resolved: &Resolved<'_>, path: &PathOnGraph) -> Vec<(usize, usize, usize)> {
    let mut steps = Vec::new();
    let mut from = path.current.as_str();
    for (n, to) in path.to_undo.iter().enumerate() {
        if to != from {
            if let (Some(a), Some(b)) = (resolved.get(from), resolved.get(to)) {
                steps.push((n + 1, a, b));
            }
        }
        from = to;
    }
    steps
}

/// A state's box.
#[derive(Clone, Copy, Debug, Default)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Rect {
    fn cx(self) -> f64 {
        self.x + self.w / 2.0
    }

    fn cy(self) -> f64 {
        self.y + self.h / 2.0
    }

    fn right(self) -> f64 {
        self.x + self.w
    }

    fn bottom(self) -> f64 {
        self.y + self.h
    }

    /// The x of its left (`side` < 0) or right side.
    fn side_x(self, side: f64) -> f64 {
        if side < 0.0 { self.x } else { self.right() }
    }
}

/// Where the states are: each one's box and layer, and each layer's states in order.
struct Layout {
    boxes: Vec<Rect>,
    layer: Vec<usize>,
    rows: Vec<Vec<usize>>,
    /// States with an edge to themselves: the loop takes their right side.
    looped: Vec<bool>,
}

impl Layout {
    fn new(graph: &MachineGraph, edges: &[(usize, usize)]) -> Self {
        let layer = layers(graph, edges);
        let mut rows = vec![Vec::new(); layer.iter().max().map_or(0, |m| m + 1)];
        // Declaration order within a layer: the order the machine's author wrote.
        for (state, &l) in layer.iter().enumerate() {
            rows[l].push(state);
        }
        let widths: Vec<f64> = graph.states.iter().map(|s| node_width(&s.name)).collect();
        let row_width = |row: &[usize]| {
            let gaps = row.len().saturating_sub(1) as f64 * NODE_GAP;
            row.iter().map(|&s| widths[s]).sum::<f64>() + gaps
        };
        let widest = rows.iter().map(|r| row_width(r)).fold(0.0, f64::max);
        let mut boxes = vec![Rect::default(); widths.len()];
        for (r, row) in rows.iter().enumerate() {
            // Centred: a chain of states reads as one straight column.
            let mut x = (widest - row_width(row)) / 2.0;
            for &state in row {
                let (y, w, h) = (r as f64 * ROW_PITCH, widths[state], NODE_H);
                boxes[state] = Rect { x, y, w, h };
                x += w + NODE_GAP;
            }
        }
        let mut looped = vec![false; boxes.len()];
        for &(from, _) in edges.iter().filter(|(from, to)| from == to) {
            looped[from] = true;
        }
        Self {
            boxes,
            layer,
            rows,
            looped,
        }
    }

    /// Whether nothing stands beside `state` on `side` in its layer (nor its self-loop),
    /// so a route can leave or enter it sideways.
    fn outermost(&self, state: usize, side: f64) -> bool {
        if side > 0.0 && self.looped[state] {
            return false;
        }
        let row = &self.rows[self.layer[state]];
        let end = if side < 0.0 { row.first() } else { row.last() };
        end == Some(&state)
    }

    /// How far out `side` reaches the outermost box of layers `lo..=hi`, measured
    /// outwards (negated on the left), so both sides share [`lanes`].
    fn reach(&self, lo: usize, hi: usize, side: f64) -> f64 {
        let rows = self.rows[lo..=hi].iter().flatten();
        rows.map(|&s| side * self.boxes[s].side_x(side))
            .fold(f64::MIN, f64::max)
    }

    /// Whether a straight edge from `from` down to `to` would cross a box of a layer in
    /// between (judged on the boxes' centres, with room for the ends' spread).
    fn blocked(&self, from: usize, to: usize) -> bool {
        let (a, b) = (self.boxes[from].cx(), self.boxes[to].cx());
        let (lo, hi) = (a.min(b) - PORT_STEP, a.max(b) + PORT_STEP);
        let between = &self.rows[self.layer[from] + 1..self.layer[to]];
        let boxes = between.iter().flatten().map(|&s| self.boxes[s]);
        boxes.into_iter().any(|r| r.x < hi && r.right() > lo)
    }
}

/// Each state's layer: its breadth-first depth from the initial states along declared
/// edges; states no initial state reaches go in one layer after the rest.
fn layers(graph: &MachineGraph, edges: &[(usize, usize)]) -> Vec<usize> {
    let mut next = vec![Vec::new(); graph.states.len()];
    for &(from, to) in edges {
        next[from].push(to);
    }
    let mut depth: Vec<Option<usize>> = vec![None; graph.states.len()];
    let mut queue = VecDeque::new();
    for (state, _) in graph.states.iter().enumerate().filter(|(_, s)| s.initial) {
        depth[state] = Some(0);
        queue.push_back(state);
    }
    while let Some(state) = queue.pop_front() {
        let d = depth[state].map_or(0, |d| d + 1);
        for &to in &next[state] {
            if depth[to].is_none() {
                depth[to] = Some(d);
                queue.push_back(to);
            }
        }
    }
    let last = depth.iter().flatten().max().map_or(0, |d| d + 1);
    depth.into_iter().map(|d| d.unwrap_or(last)).collect()
}

/// A box wide enough for `name`.
fn node_width(name: &str) -> f64 {
    (name.chars().count() as f64 * CHAR_W + NODE_PAD).max(NODE_MIN_W)
}

/// The drawing's extent, grown by everything drawn, so the picture fits its content
/// whatever sticks out (lanes, labels, start dots).
#[derive(Default)]
struct Bounds {
    extent: Option<(f64, f64, f64, f64)>,
}

impl Bounds {
    fn include(&mut self, x: f64, y: f64) {
        let (x0, y0, x1, y1) = self.extent.unwrap_or((x, y, x, y));
        self.extent = Some((x0.min(x), y0.min(y), x1.max(x), y1.max(y)));
    }

    fn include_rect(&mut self, r: Rect) {
        self.include(r.x, r.y);
        self.include(r.right(), r.bottom());
    }

    /// The translation that puts the drawing at the margin, and the picture's size.
    fn frame(&self) -> ((f64, f64), (f64, f64)) {
        let (x0, y0, x1, y1) = self.extent.unwrap_or_default();
        let shift = (MARGIN - x0, MARGIN - y0);
        (shift, (x1 - x0 + 2.0 * MARGIN, y1 - y0 + 2.0 * MARGIN))
    }
}

/// How a declared edge is drawn.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// Down to a deeper layer, nothing in the way: bottom to top.
    Straight,
    /// Back up, or down past other states: around the right side.
    Around,
    /// Within a layer: an arc over the row.
    Arc,
    /// To itself: a loop on the right side.
    Loop,
}

/// How the edge from `from` to `to` is drawn, given where the layout put them.
fn shape(layout: &Layout, from: usize, to: usize) -> Shape {
    let (a, b) = (layout.layer[from], layout.layer[to]);
    if from == to {
        Shape::Loop
    } else if a == b {
        Shape::Arc
    } else if b < a || layout.blocked(from, to) {
        Shape::Around
    } else {
        Shape::Straight
    }
}

/// A declared edge between known states, and its path data.
struct Edge {
    from: usize,
    to: usize,
    d: String,
}

/// Every declared edge between known states, routed, in declaration order.
fn route_edges(
    layout: &Layout,
    edges: &[(usize, usize)],
    bounds: &mut Bounds,
    channels: &mut Channels,
) -> Vec<Edge> {
    let shapes: Vec<Shape> = edges.iter().map(|&(a, b)| shape(layout, a, b)).collect();
    let pick = |want: Shape| -> Vec<(usize, usize)> {
        let picked = edges.iter().zip(&shapes).filter(|(_, s)| **s == want);
        picked.map(|(e, _)| *e).collect()
    };
    let straight = pick(Shape::Straight);
    let around = pick(Shape::Around);
    let mut ends = ports(layout, &straight).into_iter();
    let mut lanes = lanes(layout, &around, 1.0).into_iter();
    let mut out = Vec::with_capacity(edges.len());
    for (&(a, b), shape) in edges.iter().zip(&shapes) {
        let (ra, rb) = (layout.boxes[a], layout.boxes[b]);
        let d = match shape {
            Shape::Straight => {
                let (sx, tx) = ends.next().unwrap_or((ra.cx(), rb.cx()));
                straight_path((sx, ra.bottom()), (tx, rb.y))
            }
            Shape::Around => {
                let lane = lanes.next().unwrap_or(ra.right() + LANE_BASE);
                let points = side_points(layout, (a, b), lane, 1.0, channels);
                points.iter().for_each(|&(x, y)| bounds.include(x, y));
                rounded(&points)
            }
            Shape::Arc => arc(ra, rb, -1.0, bounds).0,
            Shape::Loop => self_loop(ra, bounds),
        };
        out.push(Edge { from: a, to: b, d });
    }
    out
}

/// An undo arrow: its number, ends, path data and where its label goes.
struct UndoArrow {
    step: usize,
    from: usize,
    to: usize,
    d: String,
    label: (f64, f64, &'static str),
}

/// The undo arrows: around the left side, or under the row within a layer.
fn route_undos(
    layout: &Layout,
    steps: &[(usize, usize, usize)],
    bounds: &mut Bounds,
    channels: &mut Channels,
) -> Vec<UndoArrow> {
    let is_arc = |a: usize, b: usize| layout.layer[a] == layout.layer[b];
    let around: Vec<(usize, usize)> = steps.iter().map(|&(_, a, b)| (a, b)).collect();
    let around: Vec<_> = around.into_iter().filter(|&(a, b)| !is_arc(a, b)).collect();
    let mut lanes = lanes(layout, &around, -1.0).into_iter();
    let mut labels = Labels::default();
    let mut out = Vec::with_capacity(steps.len());
    for &(step, from, to) in steps {
        let (ra, rb) = (layout.boxes[from], layout.boxes[to]);
        let text_w = format!("undo {step}").len() as f64 * LABEL_CHAR_W;
        let (d, label) = if is_arc(from, to) {
            let (d, (x, y)) = arc(ra, rb, 1.0, bounds);
            let y = labels.place(x - text_w / 2.0, x + text_w / 2.0, y + 12.0);
            bounds.include(x - text_w / 2.0, y + 2.0);
            bounds.include(x + text_w / 2.0, y + 2.0);
            (d, (x, y, "middle"))
        } else {
            let lane = lanes.next().unwrap_or(ra.x - LANE_BASE);
            let points = side_points(layout, (from, to), lane, -1.0, channels);
            points.iter().for_each(|&(x, y)| bounds.include(x, y));
            // Beside the lane, outside it, clear of the boxes; nearer the start than the
            // end, so two arrows between the same layers, opposite ways, keep apart.
            let x = lane - 5.0;
            let y = labels.place(x - text_w, x, lane_label_y(&points, lane) + 4.0);
            bounds.include(x - text_w, y - LABEL_H);
            bounds.include(x - text_w, y + 2.0);
            (rounded(&points), (x, y, "end"))
        };
        out.push(UndoArrow {
            step,
            from,
            to,
            d,
            label,
        });
    }
    out
}

/// Undo labels placed so far, so that the next does not cover one.
#[derive(Default)]
struct Labels {
    /// `(left, right, baseline)` of each.
    placed: Vec<(f64, f64, f64)>,
}

impl Labels {
    /// The baseline nearest `y` where a label spanning `left..right` covers no other.
    fn place(&mut self, left: f64, right: f64, y: f64) -> f64 {
        let free = |y: f64| {
            let clear =
                |&(l, r, b): &(f64, f64, f64)| r <= left || right <= l || (b - y).abs() >= LABEL_H;
            self.placed.iter().all(clear)
        };
        let tries = (0..=2 * self.placed.len()).map(|i| {
            // 0, +1, -1, +2, -2… label heights away.
            let k = i.div_ceil(2) as f64;
            if i % 2 == 1 {
                y + k * LABEL_H
            } else {
                y - k * LABEL_H
            }
        });
        let y = tries.into_iter().find(|&y| free(y)).unwrap_or(y);
        self.placed.push((left, right, y));
        y
    }
}

/// Where along the vertical at `lane` a label goes: a third of its way.
fn lane_label_y(points: &[(f64, f64)], lane: f64) -> f64 {
    let on_lane = |p: &&(f64, f64)| (p.0 - lane).abs() < 0.01;
    let mut ys = points.iter().filter(on_lane).map(|p| p.1);
    let first = ys.next().unwrap_or_default();
    let last = ys.next_back().unwrap_or(first);
    first + (last - first) / 3.0
}

/// Where side routes run through the gaps between rows: each gap's channels in turn.
#[derive(Default)]
struct Channels {
    /// Channels taken, by the row below the gap.
    taken: HashMap<usize, usize>,
}

impl Channels {
    /// The y of a fresh channel in the gap above `row` (row 0 has one too, above it).
    fn next(&mut self, row: usize) -> f64 {
        let taken = self.taken.entry(row).or_default();
        let y = row as f64 * ROW_PITCH - (ROW_PITCH - NODE_H) + CHANNEL;
        let y = y + (*taken % CHANNELS) as f64 * CHANNEL_STEP;
        *taken += 1;
        y
    }
}

/// Where straight edges leave their source's bottom and reach their target's top
/// (`(source x, target x)` per edge): spread in the order of the other end, so arrows
/// into one state do not overlap and do not cross each other.
fn ports(layout: &Layout, straight: &[(usize, usize)]) -> Vec<(f64, f64)> {
    let n = layout.boxes.len();
    let (mut leaving, mut arriving) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    for (k, &(a, b)) in straight.iter().enumerate() {
        leaving[a].push(k);
        arriving[b].push(k);
    }
    let sx = spread(layout, leaving, |k| straight[k].1);
    let tx = spread(layout, arriving, |k| straight[k].0);
    sx.into_iter().zip(tx).collect()
}

/// For each edge, its x along the box it belongs to in `groups` (edges by box).
fn spread(layout: &Layout, groups: Vec<Vec<usize>>, other: impl Fn(usize) -> usize) -> Vec<f64> {
    let mut xs = vec![0.0; groups.iter().map(Vec::len).sum()];
    for (state, mut group) in groups.into_iter().enumerate() {
        let other_x = |k: usize| layout.boxes[other(k)].cx();
        group.sort_by(|&p, &q| other_x(p).total_cmp(&other_x(q)));
        let rect = layout.boxes[state];
        // The middle of the box only: its corners are for side routes and arcs.
        let k = group.len() as f64;
        let step = PORT_STEP.min((rect.w - 4.0 * CORNER_PORT) / k).max(0.0);
        for (i, edge) in group.into_iter().enumerate() {
            xs[edge] = rect.cx() + (i as f64 - (k - 1.0) / 2.0) * step;
        }
    }
    xs
}

/// Picks the lane (the x of the vertical) of each route around `side` (`1.0` right,
/// `-1.0` left). Shorter routes go nearer the boxes; a route goes outside any shorter
/// route whose layers it spans, so they do not cross; routes sharing a layer keep
/// [`LANE_GAP`] apart.
fn lanes(layout: &Layout, routes: &[(usize, usize)], side: f64) -> Vec<f64> {
    let spans: Vec<(usize, usize)> = routes
        .iter()
        .map(|&(a, b)| {
            let (la, lb) = (layout.layer[a], layout.layer[b]);
            (la.min(lb), la.max(lb))
        })
        .collect();
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| spans[i].1 - spans[i].0);
    // Distances outwards from the boxes' centre line, whichever the side.
    let mut placed: Vec<Option<f64>> = vec![None; spans.len()];
    for i in order {
        let (lo, hi) = spans[i];
        let mut floor = layout.reach(lo, hi, side) + LANE_BASE;
        let mut near = Vec::new();
        for (j, at) in placed.iter().enumerate() {
            let (Some(at), (l, h)) = (*at, spans[j]) else {
                continue;
            };
            if lo <= l && h <= hi && h - l < hi - lo {
                floor = floor.max(at + LANE_GAP);
            } else if l <= hi && lo <= h {
                near.push(at);
            }
        }
        placed[i] = Some(free_lane(floor, &near));
    }
    placed
        .into_iter()
        .map(|at| side * at.unwrap_or(0.0))
        .collect()
}

/// The nearest distance from `floor` out that keeps [`LANE_GAP`] from every `near` lane.
fn free_lane(floor: f64, near: &[f64]) -> f64 {
    let clear = |x: f64| near.iter().all(|&p| (x - p).abs() >= LANE_GAP - 0.01);
    let mut candidates: Vec<f64> = near.iter().map(|p| p + LANE_GAP).collect();
    candidates.push(floor);
    candidates.retain(|&x| x >= floor);
    candidates.sort_by(f64::total_cmp);
    let furthest = near.iter().fold(floor, |m, &p| m.max(p + LANE_GAP));
    candidates
        .into_iter()
        .find(|&x| clear(x))
        .unwrap_or(furthest)
}

/// The corners of a route from `from` to `to` around `side` through the vertical at
/// `lane`. A box with nothing beside it is left and entered sideways; otherwise the
/// route leaves through the top or bottom (facing its way) into the gap between rows,
/// so it crosses no neighbour.
fn side_points(
    layout: &Layout,
    (from, to): (usize, usize),
    lane: f64,
    side: f64,
    channels: &mut Channels,
) -> Vec<(f64, f64)> {
    let (a, b) = (layout.boxes[from], layout.boxes[to]);
    let (row_a, row_b) = (layout.layer[from], layout.layer[to]);
    // Which way the route travels: up (-1) or down.
    let up = if layout.layer[to] < layout.layer[from] {
        -1.0
    } else {
        1.0
    };
    let port = |r: Rect| r.side_x(side) - side * CORNER_PORT;
    let mut points = Vec::with_capacity(6);
    if layout.outermost(from, side) {
        let y = a.cy() + up * EXIT_OFFSET;
        points.extend([(a.side_x(side), y), (lane, y)]);
    } else {
        let (edge, gap) = if up < 0.0 {
            (a.y, channels.next(row_a))
        } else {
            (a.bottom(), channels.next(row_a + 1))
        };
        points.extend([(port(a), edge), (port(a), gap), (lane, gap)]);
    }
    if layout.outermost(to, side) {
        let y = b.cy() - up * ENTRY_OFFSET;
        points.extend([(lane, y), (b.side_x(side), y)]);
    } else {
        // It comes from where it travels from: from below when going up.
        let (edge, gap) = if up < 0.0 {
            (b.bottom(), channels.next(row_b + 1))
        } else {
            (b.y, channels.next(row_b))
        };
        points.extend([(lane, gap), (port(b), gap), (port(b), edge)]);
    }
    points
}

/// Path data through `points` with rounded corners.
fn rounded(points: &[(f64, f64)]) -> String {
    let mut d = String::new();
    let (Some(&(x0, y0)), Some(&(xn, yn))) = (points.first(), points.last()) else {
        return d;
    };
    // Writing to a String cannot fail.
    let _ = write!(d, "M{},{}", N(x0), N(y0));
    for w in points.windows(3) {
        let (p, c, n) = (w[0], w[1], w[2]);
        let r = CORNER.min(dist(p, c) / 2.0).min(dist(c, n) / 2.0);
        let (a, b) = (toward(c, p, r), toward(c, n, r));
        let _ = write!(
            d,
            "L{},{}Q{},{} {},{}",
            N(a.0),
            N(a.1),
            N(c.0),
            N(c.1),
            N(b.0),
            N(b.1)
        );
    }
    if points.len() > 1 {
        let _ = write!(d, "L{},{}", N(xn), N(yn));
    }
    d
}

fn dist(p: (f64, f64), q: (f64, f64)) -> f64 {
    (p.0 - q.0).hypot(p.1 - q.1)
}

/// The point `r` from `from` towards `to`.
fn toward(from: (f64, f64), to: (f64, f64), r: f64) -> (f64, f64) {
    let len = dist(from, to);
    if len == 0.0 {
        return from;
    }
    (
        from.0 + (to.0 - from.0) * r / len,
        from.1 + (to.1 - from.1) * r / len,
    )
}

/// A gentle S-curve from a bottom to a top: it leaves and arrives vertically, so the
/// arrowhead points straight into the box.
fn straight_path((sx, sy): (f64, f64), (tx, ty): (f64, f64)) -> String {
    let mid = (sy + ty) / 2.0;
    if (sx - tx).abs() < 0.5 {
        return format!("M{},{}L{},{}", N(sx), N(sy), N(tx), N(ty));
    }
    format!(
        "M{},{}C{},{} {},{} {},{}",
        N(sx),
        N(sy),
        N(sx),
        N(mid),
        N(tx),
        N(mid),
        N(tx),
        N(ty)
    )
}

/// An arc between two boxes of one row, over it (`dir` -1) or under it (1), from near
/// one's corner to near the other's facing corner: clear of the middle, where straight
/// edges and the start arrow attach. Returns the path data and its apex.
fn arc(a: Rect, b: Rect, dir: f64, bounds: &mut Bounds) -> (String, (f64, f64)) {
    let rightwards = b.cx() >= a.cx();
    let (sx, tx) = if rightwards {
        (a.right() - 2.0 * CORNER_PORT, b.x + 2.0 * CORNER_PORT)
    } else {
        (a.x + 2.0 * CORNER_PORT, b.right() - 2.0 * CORNER_PORT)
    };
    let y = if dir < 0.0 { a.y } else { a.bottom() };
    let control = y + dir * ARC_H;
    let apex = ((sx + tx) / 2.0, y + dir * ARC_H * 0.75);
    bounds.include(apex.0, apex.1);
    let d = format!(
        "M{},{}C{},{} {},{} {},{}",
        N(sx),
        N(y),
        N(sx),
        N(control),
        N(tx),
        N(control),
        N(tx),
        N(y)
    );
    (d, apex)
}

/// A small loop on a box's right side (which side routes then leave alone), out above
/// the middle and back in below it.
fn self_loop(r: Rect, bounds: &mut Bounds) -> String {
    let (x, y) = (r.right(), r.cy());
    bounds.include(x + 26.0, y);
    format!(
        "M{},{}C{},{} {},{} {},{}",
        N(x),
        N(y - 8.0),
        N(x + 34.0),
        N(y - 30.0),
        N(x + 34.0),
        N(y + 30.0),
        N(x),
        N(y + 8.0)
    )
}

/// Writes the picture.
fn render(
    graph: &MachineGraph,
    layout: &Layout,
    marks: &Marks,
    edges: &[Edge],
    undos: &[UndoArrow],
    bounds: &Bounds,
) -> String {
    let ((dx, dy), (w, h)) = bounds.frame();
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="procflow-diagram" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">"#,
        w = N(w),
        h = N(h)
    );
    let _ = writeln!(out, "<title>{}</title>", Escaped(&graph.name));
    let _ = write!(out, "<style>\n{STYLE}</style>\n{DEFS}");
    let _ = writeln!(
        out,
        r#"<g class="pf-canvas" transform="translate({},{})">"#,
        N(dx),
        N(dy)
    );
    for edge in edges {
        let taken = marks.taken.contains(&(edge.from, edge.to));
        write_edge(&mut out, graph, edge, taken);
    }
    for (state, node) in graph.states.iter().enumerate() {
        let r = layout.boxes[state];
        if node.initial {
            write_start(&mut out, r);
        }
        write_state(&mut out, node, r, marks.place(state));
    }
    for undo in undos {
        write_undo(&mut out, graph, undo);
    }
    out.push_str("</g>\n</svg>\n");
    out
}

fn write_edge(out: &mut String, graph: &MachineGraph, edge: &Edge, taken: bool) {
    let class = if taken { "edge taken" } else { "edge" };
    let from = Escaped(&graph.states[edge.from].name);
    let to = Escaped(&graph.states[edge.to].name);
    let d = &edge.d;
    let _ = writeln!(
        out,
        r#"<path class="{class}" data-from="{from}" data-to="{to}" marker-end="url(#pf-arrow)" d="{d}"/>"#
    );
}

/// The start dot above an initial state, with an arrow into it.
fn write_start(out: &mut String, r: Rect) {
    let (x, top) = (r.cx(), r.y);
    let dot = top - START_GAP;
    let _ = writeln!(
        out,
        r#"<circle class="start" cx="{}" cy="{}" r="{}"/><path class="start-arrow" marker-end="url(#pf-arrow)" d="M{},{}L{},{}"/>"#,
        N(x),
        N(dot),
        N(START_R),
        N(x),
        N(dot + START_R),
        N(x),
        N(top)
    );
}

/// A state's group: its box (doubled if terminal), a point-of-no-return mark, its name.
fn write_state(out: &mut String, node: &StateNode, r: Rect, place: Option<&str>) {
    let flags = [
        (node.initial, "initial"),
        (node.terminal, "terminal"),
        (node.rollback, "rollback"),
        (node.no_rollback, "no_rollback"),
    ];
    let mut class = String::from("state");
    for (_, name) in flags.iter().filter(|(on, _)| *on) {
        class.push(' ');
        class.push_str(name);
    }
    if let Some(place) = place {
        class.push(' ');
        class.push_str(place);
    }
    let name = Escaped(&node.name);
    let _ = write!(out, r#"<g class="{class}" data-state="{name}">"#);
    write_rect(out, r, NODE_RX, None);
    if node.terminal {
        let inner = Rect {
            x: r.x + 4.0,
            y: r.y + 4.0,
            w: r.w - 8.0,
            h: r.h - 8.0,
        };
        write_rect(out, inner, NODE_RX - 3.0, Some("inner"));
    }
    if node.no_rollback {
        // A small diamond in the top-left corner, above the name.
        let (x, y) = (r.x + 10.0, r.y + 10.0);
        let _ = write!(
            out,
            r#"<path class="pnr" d="M{},{}l4,4l-4,4l-4,-4z"/>"#,
            N(x),
            N(y - 4.0)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" dominant-baseline="central">{name}</text></g>"#,
        N(r.cx()),
        N(r.cy())
    );
}

fn write_rect(out: &mut String, r: Rect, rx: f64, class: Option<&str>) {
    let class = class
        .map(|c| format!(r#" class="{c}""#))
        .unwrap_or_default();
    let _ = write!(
        out,
        r#"<rect{class} x="{}" y="{}" width="{}" height="{}" rx="{}"/>"#,
        N(r.x),
        N(r.y),
        N(r.w),
        N(r.h),
        N(rx)
    );
}

fn write_undo(out: &mut String, graph: &MachineGraph, undo: &UndoArrow) {
    let (from, to) = (
        Escaped(&graph.states[undo.from].name),
        Escaped(&graph.states[undo.to].name),
    );
    let (x, y, anchor) = undo.label;
    let _ = writeln!(
        out,
        r#"<path class="undo" data-from="{from}" data-to="{to}" data-step="{step}" marker-end="url(#pf-arrow-undo)" d="{d}"/><text class="undo-label" x="{x}" y="{y}" text-anchor="{anchor}">undo {step}</text>"#,
        step = undo.step,
        d = undo.d,
        x = N(x),
        y = N(y)
    );
}

/// A coordinate, rounded to a tenth, written without trailing zeros.
struct N(f64);

impl fmt::Display for N {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `+ 0.0` turns -0 into 0.
        write!(f, "{}", (self.0 * 10.0).round() / 10.0 + 0.0)
    }
}

/// Text escaped for XML content and attribute values.
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '&' => f.write_str("&amp;")?,
                '<' => f.write_str("&lt;")?,
                '>' => f.write_str("&gt;")?,
                '"' => f.write_str("&quot;")?,
                '\'' => f.write_str("&apos;")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(name: &str) -> StateNode {
        StateNode {
            name: name.to_owned(),
            initial: false,
            terminal: false,
            rollback: false,
            no_rollback: false,
        }
    }

    /// A graph of `names` (the first initial, the last terminal) and `edges`.
    fn graph(names: &[&str], edges: &[(&str, &str)]) -> MachineGraph {
        let mut states: Vec<StateNode> = names.iter().map(|n| state(n)).collect();
        if let Some(first) = states.first_mut() {
            first.initial = true;
        }
        if let Some(last) = states.last_mut() {
            last.terminal = true;
        }
        MachineGraph {
            name: "Test".to_owned(),
            states,
            edges: edges
                .iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect(),
        }
    }

    /// Prepare → WriteLayout → AddToMeta → AssignRegions → Created, and a retry loop
    /// AssignRegions → AddToMeta.
    fn create_table() -> MachineGraph {
        let mut graph = graph(
            &[
                "Prepare",
                "WriteLayout",
                "AddToMeta",
                "AssignRegions",
                "Created",
            ],
            &[
                ("Prepare", "WriteLayout"),
                ("WriteLayout", "AddToMeta"),
                ("AddToMeta", "AssignRegions"),
                ("AssignRegions", "Created"),
                ("AssignRegions", "AddToMeta"),
            ],
        );
        graph.states[1].rollback = true;
        graph.states[2].rollback = true;
        graph.states[3].no_rollback = true;
        graph
    }

    fn path(current: &str, visited: &[&str], undone: &[&str], to_undo: &[&str]) -> PathOnGraph {
        let owned = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        PathOnGraph {
            current: current.to_owned(),
            visited: owned(visited),
            undone: owned(undone),
            to_undo: owned(to_undo),
        }
    }

    /// `(classes, data-state)` of every state's group.
    fn state_groups(svg: &str) -> Vec<(String, String)> {
        let attr = |tag: &str, name: &str| {
            let start = tag.find(&format!(r#"{name}=""#))? + name.len() + 2;
            let len = tag[start..].find('"')?;
            Some(tag[start..start + len].to_owned())
        };
        svg.split(r#"<g class="state"#)
            .skip(1)
            .map(|rest| {
                let tag = &rest[..rest.find('>').unwrap_or(rest.len())];
                let tag = format!(r#"class="state{tag}"#);
                (
                    attr(&tag, "class").unwrap_or_default(),
                    attr(&tag, "data-state").unwrap_or_default(),
                )
            })
            .collect()
    }

    fn classes_of(svg: &str, state: &str) -> Vec<String> {
        let groups = state_groups(svg);
        let (classes, _) = groups
            .iter()
            .find(|(_, s)| s == state)
            .expect("state drawn");
        classes.split(' ').map(str::to_owned).collect()
    }

    /// The `<path>` elements with `class`.
    fn paths<'s>(svg: &'s str, class: &str) -> Vec<&'s str> {
        let open = format!(r#"<path class="{class}""#);
        svg.match_indices(&open)
            .map(|(at, _)| &svg[at..at + svg[at..].find("/>").unwrap_or(0)])
            .collect()
    }

    #[test]
    fn exactly_one_state_is_current() {
        let svg =
            create_table().svg_with(&path("AddToMeta", &["Prepare", "WriteLayout"], &[], &[]));
        let current: Vec<_> = state_groups(&svg)
            .into_iter()
            .filter(|(classes, _)| classes.split(' ').any(|c| c == "current"))
            .collect();
        assert_eq!(current.len(), 1, "{svg}");
        assert_eq!(current[0].1, "AddToMeta");
        assert!(svg.contains(r#"<g class="state rollback current" data-state="AddToMeta">"#));
    }

    #[test]
    fn no_path_marks_nothing() {
        let svg = create_table().svg();
        for (classes, _) in state_groups(&svg) {
            for mark in ["current", "visited", "undone"] {
                assert!(!classes.split(' ').any(|c| c == mark), "{classes}");
            }
        }
        assert!(paths(&svg, "edge taken").is_empty());
        assert!(!svg.contains("class=\"undo"));
    }

    #[test]
    fn graph_flags_become_classes() {
        let svg = create_table().svg();
        assert_eq!(classes_of(&svg, "Prepare"), ["state", "initial"]);
        assert_eq!(classes_of(&svg, "WriteLayout"), ["state", "rollback"]);
        assert_eq!(classes_of(&svg, "AssignRegions"), ["state", "no_rollback"]);
        assert_eq!(classes_of(&svg, "Created"), ["state", "terminal"]);
        assert_eq!(svg.matches(r#"<circle class="start""#).count(), 1);
        assert_eq!(svg.matches(r#"<path class="pnr""#).count(), 1);
        assert_eq!(svg.matches(r#"class="inner""#).count(), 1);
    }

    #[test]
    fn visited_and_undone_classes() {
        let rolling_back = path(
            "WriteLayout",
            &["Prepare", "WriteLayout", "AddToMeta", "AssignRegions"],
            &["AssignRegions", "AddToMeta"],
            &["Prepare"],
        );
        let svg = create_table().svg_with(&rolling_back);
        assert_eq!(classes_of(&svg, "Prepare"), ["state", "initial", "visited"]);
        // Visited and current: current only.
        assert_eq!(
            classes_of(&svg, "WriteLayout"),
            ["state", "rollback", "current"]
        );
        // Visited and undone: undone wins.
        assert_eq!(
            classes_of(&svg, "AddToMeta"),
            ["state", "rollback", "undone"]
        );
        assert_eq!(
            classes_of(&svg, "AssignRegions"),
            ["state", "no_rollback", "undone"]
        );
        assert_eq!(classes_of(&svg, "Created"), ["state", "terminal"]);
    }

    #[test]
    fn taken_edges_follow_the_path() {
        let svg = create_table().svg_with(&path(
            "AssignRegions",
            &[
                "Prepare",
                "WriteLayout",
                "AddToMeta",
                "AssignRegions",
                "AddToMeta",
            ],
            &[],
            &[],
        ));
        let ends = |class| -> Vec<(String, String)> {
            let mut ends: Vec<_> = paths(&svg, class)
                .into_iter()
                .map(|p| {
                    let from = p.split(r#"data-from=""#).nth(1).unwrap_or("");
                    let to = p.split(r#"data-to=""#).nth(1).unwrap_or("");
                    let cut = |s: &str| s[..s.find('"').unwrap_or(0)].to_owned();
                    (cut(from), cut(to))
                })
                .collect();
            ends.sort();
            ends
        };
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(
            ends("edge taken"),
            [
                pair("AddToMeta", "AssignRegions"),
                pair("AssignRegions", "AddToMeta"),
                pair("Prepare", "WriteLayout"),
                pair("WriteLayout", "AddToMeta"),
            ]
        );
        assert_eq!(ends("edge"), [pair("AssignRegions", "Created")]);
        for edge in paths(&svg, "edge") {
            assert!(edge.contains(r#"marker-end="url(#pf-arrow)""#), "{edge}");
        }
    }

    #[test]
    fn undo_arrows_are_numbered_in_order() {
        let rolling_back = path(
            "AssignRegions",
            &["Prepare", "WriteLayout", "AddToMeta"],
            &[],
            // AssignRegions itself first: no arrow, but it keeps its number.
            &["AssignRegions", "AddToMeta", "WriteLayout", "Prepare"],
        );
        let svg = create_table().svg_with(&rolling_back);
        let undos = paths(&svg, "undo");
        assert_eq!(undos.len(), 3, "{svg}");
        let expected = [
            ("AssignRegions", "AddToMeta", 2),
            ("AddToMeta", "WriteLayout", 3),
            ("WriteLayout", "Prepare", 4),
        ];
        for (undo, (from, to, step)) in undos.iter().zip(expected) {
            let attrs = format!(r#"data-from="{from}" data-to="{to}" data-step="{step}""#);
            assert!(undo.contains(&attrs), "{undo}");
            assert!(undo.contains("url(#pf-arrow-undo)"), "{undo}");
        }
        let labels: Vec<_> = svg
            .match_indices(">undo ")
            .map(|(at, _)| &svg[at + 1..at + 7])
            .collect();
        assert_eq!(labels, ["undo 2", "undo 3", "undo 4"]);
        assert_eq!(svg.matches(r#"<text class="undo-label""#).count(), 3);
    }

    #[test]
    fn names_are_escaped() {
        let mut graph = graph(&["A<&>\"'", "B"], &[("A<&>\"'", "B")]);
        graph.name = "M<&>".to_owned();
        let svg = graph.svg_with(&path("A<&>\"'", &[], &[], &[]));
        let escaped = "A&lt;&amp;&gt;&quot;&apos;";
        assert!(svg.contains(&format!(r#"data-state="{escaped}""#)), "{svg}");
        assert!(svg.contains(&format!(">{escaped}</text>")));
        assert!(svg.contains(&format!(r#"data-from="{escaped}" data-to="B""#)));
        assert!(svg.contains("<title>M&lt;&amp;&gt;</title>"));
        assert!(!svg.contains("A<&"));
        assert_eq!(classes_of(&svg, escaped), ["state", "initial", "current"]);
    }

    #[test]
    fn self_loop_and_back_edge_are_drawn() {
        let graph = graph(
            &["Start", "Poll", "Done"],
            &[
                ("Start", "Poll"),
                ("Poll", "Poll"),
                ("Poll", "Start"),
                ("Poll", "Done"),
            ],
        );
        let svg = graph.svg();
        let edges = paths(&svg, "edge");
        assert_eq!(edges.len(), 4);
        for edge in &edges {
            let d = edge.split(r#" d=""#).nth(1).unwrap_or("");
            assert!(d.starts_with('M') && d.len() > 10, "{edge}");
        }
        // Both go round the right side: further right than any box.
        let right = |edge: &str| {
            let d = edge.split(r#" d=""#).nth(1).unwrap_or("");
            d.split(|c: char| c.is_ascii_alphabetic() || c == ' ')
                .filter_map(|point| point.split_once(',')?.0.parse::<f64>().ok())
                .fold(0.0, f64::max)
        };
        let layout = Layout::new(&graph, &Resolved::new(&graph).edges);
        let boxes_right = layout.boxes.iter().map(|r| r.right()).fold(0.0, f64::max);
        assert!(right(edges[1]) > boxes_right, "{}", edges[1]);
        assert!(
            right(edges[2]) > boxes_right + LANE_BASE - 1.0,
            "{}",
            edges[2]
        );
    }

    #[test]
    fn layers_follow_breadth_first_depth() {
        let graph = graph(
            &["A", "B", "C", "Lost", "D"],
            &[
                ("A", "B"),
                ("A", "C"),
                ("B", "D"),
                ("C", "D"),
                ("D", "A"),
                ("X", "A"),
            ],
        );
        assert_eq!(
            layers(&graph, &Resolved::new(&graph).edges),
            [0, 1, 1, 3, 2]
        );
    }

    #[test]
    fn unknown_names_are_skipped() {
        let graph = graph(
            &["A", "B"],
            &[("A", "B"), ("A", "Nowhere"), ("Nowhere", "B")],
        );
        let svg = graph.svg_with(&path(
            "Nowhere",
            &["Ghost", "A"],
            &["Ghost"],
            &["Ghost", "A"],
        ));
        assert_eq!(paths(&svg, "edge").len(), 1);
        assert!(!svg.contains("Nowhere") && !svg.contains("Ghost"));
        assert!(
            state_groups(&svg)
                .iter()
                .all(|(c, _)| !c.contains("current"))
        );
        assert!(paths(&svg, "undo").is_empty());
    }

    #[test]
    fn empty_graph_is_a_small_svg() {
        let svg = graph(&[], &[]).svg();
        assert!(
            svg.starts_with(r#"<svg xmlns="http://www.w3.org/2000/svg" class="procflow-diagram""#)
        );
        assert!(svg.contains(r#"viewBox="0 0 24 24""#), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn groups_are_balanced() {
        let graphs = [
            create_table(),
            graph(&[], &[]),
            graph(
                &["A", "B", "C"],
                &[("A", "B"), ("A", "C"), ("B", "C"), ("C", "A")],
            ),
        ];
        for graph in graphs {
            let svg = graph.svg_with(&path("C", &["A", "B"], &[], &["B", "A"]));
            let opened = svg.matches("<g ").count() + svg.matches("<g>").count();
            assert_eq!(opened, svg.matches("</g>").count(), "{svg}");
            assert_eq!(svg.matches("<svg ").count(), svg.matches("</svg>").count());
            assert_eq!(
                svg.matches("<text ").count(),
                svg.matches("</text>").count()
            );
        }
    }
}
