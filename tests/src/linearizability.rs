//! A linearizability checker for histories of a key-value store, in the manner of porcupine:
//! the Wing & Gong search with Lowe's memoization ("Testing for linearizability", 2017), run
//! on each key separately (a register per key is all the model needs, and linearizability is
//! compositional, so a history is linearizable exactly when each key's sub-history is).
//!
//! A test records every client call as an [`Operation`] (what it asked, what it was told,
//! when it asked and when it was told) and hands the whole history to [`check`]. It owns no
//! files and no threads.
//!
//! The search walks a doubly linked list of the key's call and return events in time order.
//! At a call it tries to linearize that operation next: the model must accept the operation's
//! output from the current value, and the pair (set of operations linearized, value) must be
//! new, or that state was explored already and failed. On success the operation's two events
//! leave the list and the walk restarts from the front. Reaching a return event means the
//! operation it ends had to be linearized by now and could not be: the search backtracks.
//!
//! ```text
//!   time   0        10        20        30
//!   A      |--put x=1--|                          list: callA callB retA retB callC retC
//!   B           |--get → 1--|                     linearize A, then B, then C: accepted.
//!   C                             |--get → 1--|   (get → None for C: after A and B, no
//!                                                  order puts it before A; rejected.)
//! ```
//!
//! An operation whose outcome is [`Output::Unknown`] (a timed-out write) has no return event:
//! it may take effect at any point after its call, however late, or never, so the search may
//! linearize it anywhere after its call or leave it out, and succeeds once every operation
//! with a known outcome is placed.
//!
//! Timed-out writes are what makes a long run's search slow, and most of them were never seen.
//! So each key is first checked without the timed-out writes whose value no read or CAS saw.
//! A linearization of that history is one of the whole. If it has none, the same history
//! without the CASes that did not swap is checked. If that has none, the whole has none either
//! (see `without_unseen_writes` for why). Only a key that neither decides is searched whole.
//! On the 30-minute mixed-version soak (1,480,924 operations), the whole search ran out of a
//! 50-million-step budget on one key. The first pass decides every key in 0.7 s (release
//! build).
//!
//! Indexing in this module uses positions it builds itself (operation, node and value
//! numbers), never numbers taken from the history.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Set `key` to `value`.
    Put { key: String, value: String },
    /// Read `key`.
    Get { key: String },
    /// Set `key` to `new` if its value is `expected` (`None`: the key is absent).
    Cas {
        key: String,
        expected: Option<String>,
        new: String,
    },
}

impl Input {
    /// The one key the operation touches.
    pub fn key(&self) -> &str {
        match self {
            Input::Put { key, .. } | Input::Get { key } | Input::Cas { key, .. } => key,
        }
    }
}

/// What the client was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A [`Input::Put`] was acknowledged.
    Ok,
    /// A [`Input::Get`] read this value (`None`: the key was absent).
    Value(Option<String>),
    /// A [`Input::Cas`] was answered: whether it swapped.
    Swapped(bool),
    /// No answer, or a failure that leaves the outcome open (a timeout, a lost connection).
    /// A put or CAS may have taken effect at any point after its call, or never; a get with
    /// this output has no effect and is ignored.
    Unknown,
}

/// One client call: what was asked, what came back, and when.
///
/// Times are in any unit, from one clock for the whole history. `a` precedes `b` in real time
/// when `a.ret < b.call`; equal times count as overlapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// Who issued it: only for the reader of a report, the check does not use it.
    pub client: usize,
    pub input: Input,
    pub output: Output,
    /// When it was invoked.
    pub call: u64,
    /// When its response arrived. Ignored (taken as +infinity) when `output` is
    /// [`Output::Unknown`]. Invariant otherwise: `call <= ret`.
    pub ret: u64,
}

/// How much search [`check_with`] may spend before it answers [`Verdict::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Steps of the search per key (one step visits one event of the list). Counted, not
    /// timed, so that a verdict does not depend on how busy the machine is.
    ///
    /// Default: 1,000,000, well under a second for one key on a debug build. A linearizable
    /// history usually needs a few steps per operation, a few dozen with many concurrent or
    /// timed-out writes (a timed-out write that never took effect is tried again at every
    /// later point of the search).
    pub max_steps_per_key: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_steps_per_key: 1_000_000,
        }
    }
}

/// The answer of [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every key's operations have a linearization.
    Linearizable,
    /// Some key's operations have none; this is the first such key in key order.
    NotLinearizable(Violation),
    /// The search of `key` ran out of budget (and no other key was found not linearizable).
    Unknown { key: String },
    /// The history itself is wrong (a bug of the test, not of the store): `history[op]` has
    /// an output that does not fit its input, or a response before its call.
    IllFormed { op: usize, reason: &'static str },
}

impl Verdict {
    pub fn is_linearizable(&self) -> bool {
        *self == Verdict::Linearizable
    }
}

/// Why a key's operations have no linearization, as far as the search got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub key: String,
    /// The longest linearization the search found of some of the key's operations: indices
    /// into the history, in linearization order (it may include operations of
    /// [`Output::Unknown`] outcome, which every linearization may also leave out).
    pub longest_prefix: Vec<usize>,
    /// The key's value after `longest_prefix`.
    pub value: Option<String>,
    /// The index of the first operation to respond that is not in `longest_prefix`: after the
    /// prefix, neither it nor anything else invoked before its response could come next.
    pub stuck: usize,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key {:?}: after linearizing operations {:?} (value {:?}), operation {} cannot be placed",
            self.key, self.longest_prefix, self.value, self.stuck
        )
    }
}

/// Checks that `history` is linearizable, with the default [`Budget`].
pub fn check(history: &[Operation]) -> Verdict {
    check_with(history, Budget::default())
}

/// Checks that `history` is linearizable, each key with at most `budget` steps of search.
pub fn check_with(history: &[Operation], budget: Budget) -> Verdict {
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, op) in history.iter().enumerate() {
        if let Err(reason) = validate(op) {
            return Verdict::IllFormed { op: index, reason };
        }
        by_key.entry(op.input.key()).or_default().push(index);
    }
    let mut out_of_budget = None;
    for (key, indices) in by_key {
        // Two smaller histories decide most keys at once (see `without_unseen_writes`):
        // without the timed-out writes nobody read, a linearization is one of the whole; and
        // without those and the CASes that did not swap, there is none if the whole has none.
        // Only a key neither decides is searched whole.
        let max = budget.max_steps_per_key;
        let seen = without_unseen_writes(history, &indices);
        let verdict = match check_key(key, history, &seen, max) {
            KeyVerdict::Linearizable => KeyVerdict::Linearizable,
            first => {
                let plain = without_failed_cas(history, &seen);
                let refuted = match plain.len() == seen.len() {
                    true => first,
                    false => check_key(key, history, &plain, max),
                };
                match refuted {
                    KeyVerdict::Violation(v) => KeyVerdict::Violation(v),
                    other if seen.len() == indices.len() && plain.len() == seen.len() => other,
                    _ => check_key(key, history, &indices, max),
                }
            }
        };
        match verdict {
            KeyVerdict::Linearizable => {}
            KeyVerdict::Violation(violation) => return Verdict::NotLinearizable(violation),
            KeyVerdict::OutOfBudget => {
                out_of_budget.get_or_insert_with(|| key.to_owned());
            }
        }
    }
    match out_of_budget {
        Some(key) => Verdict::Unknown { key },
        None => Verdict::Linearizable,
    }
}

/// `indices` without the puts and CASes whose outcome is unknown and whose value no read saw
/// (nor any CAS that swapped or may have). They are what makes the search of a long run slow: one that
/// never took effect is tried again at every later point. In a run with unique values, most
/// timed-out writes are of this kind.
///
/// Each may never have taken effect, so a linearization of the rest is a linearization of the
/// whole. The converse holds once the CASes that did not swap are left out too
/// ([`without_failed_cas`]). Take a linearization of the whole and remove such a write from it.
/// No read directly followed it (that read would have returned its value, which no read did),
/// nor any CAS that swapped there (which would have expected its value). So only a failed CAS that followed it
/// can become illegal, by now seeing the value before it. Removing a failed CAS changes no
/// value. So if the history without both has no linearization, neither has the whole.
fn without_unseen_writes(history: &[Operation], indices: &[usize]) -> Vec<usize> {
    let ops = || indices.iter().filter_map(|&i| history.get(i).map(|op| (i, op)));
    let seen: HashSet<&str> = ops()
        .filter_map(|(_, op)| match (&op.input, &op.output) {
            (Input::Get { .. }, Output::Value(Some(v))) => Some(v.as_str()),
            // A CAS whose outcome is unknown may have swapped, and then saw its expected value.
            (Input::Cas { expected: Some(v), .. }, Output::Swapped(true) | Output::Unknown) => Some(v.as_str()),
            _ => None,
        })
        .collect();
    ops()
        .filter(|(_, op)| {
            let written = match &op.input {
                Input::Put { value, .. } => Some(value.as_str()),
                Input::Cas { new, .. } => Some(new.as_str()),
                Input::Get { .. } => None,
            };
            op.output != Output::Unknown || written.is_none_or(|v| seen.contains(v))
        })
        .map(|(i, _)| i)
        .collect()
}

/// `indices` without the CASes that did not swap (see [`without_unseen_writes`]).
fn without_failed_cas(history: &[Operation], indices: &[usize]) -> Vec<usize> {
    indices
        .iter()
        .copied()
        .filter(|&i| history.get(i).is_some_and(|op| op.output != Output::Swapped(false)))
        .collect()
}

fn validate(op: &Operation) -> Result<(), &'static str> {
    match (&op.input, &op.output) {
        (_, Output::Unknown)
        | (Input::Put { .. }, Output::Ok)
        | (Input::Get { .. }, Output::Value(_))
        | (Input::Cas { .. }, Output::Swapped(_)) => {}
        (Input::Put { .. }, _) => return Err("a put's output must be Ok or Unknown"),
        (Input::Get { .. }, _) => return Err("a get's output must be Value or Unknown"),
        (Input::Cas { .. }, _) => return Err("a CAS's output must be Swapped or Unknown"),
    }
    if op.output != Output::Unknown && op.ret < op.call {
        return Err("response before call");
    }
    Ok(())
}

/// A value of one key, interned: a position in [`Values::names`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Value(usize);

/// The key is absent.
const ABSENT: Value = Value(0);

/// The values one key's history mentions, numbered so that a state is a small integer.
struct Values<'h> {
    /// Invariant: `names[0]` is `None` and no other entry is.
    names: Vec<Option<&'h str>>,
    ids: HashMap<&'h str, Value>,
}

impl<'h> Values<'h> {
    fn new() -> Self {
        Values {
            names: vec![None],
            ids: HashMap::new(),
        }
    }

    fn id(&mut self, value: Option<&'h str>) -> Value {
        let Some(value) = value else { return ABSENT };
        *self.ids.entry(value).or_insert_with(|| {
            self.names.push(Some(value));
            Value(self.names.len() - 1)
        })
    }

    fn name(&self, value: Value) -> Option<String> {
        self.names[value.0].map(str::to_owned)
    }
}

/// What one operation does to its key's register, and the output it must produce.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A put (acknowledged or not: an unknown one is optional, not different).
    Put(Value),
    /// A get that read this value.
    Get(Value),
    /// A CAS; `swapped` is `None` when its outcome is unknown.
    Cas {
        expected: Value,
        new: Value,
        swapped: Option<bool>,
    },
}

impl Step {
    /// The value after this step from `value`, or `None` if the step cannot produce its
    /// recorded output from `value`.
    fn apply(self, value: Value) -> Option<Value> {
        match self {
            Step::Put(new) => Some(new),
            Step::Get(read) => (read == value).then_some(value),
            Step::Cas { expected, new, swapped } => match swapped {
                None => Some(if value == expected { new } else { value }),
                Some(true) => (value == expected).then_some(new),
                Some(false) => (value != expected).then_some(value),
            },
        }
    }
}

/// One operation of a key's sub-history.
struct KeyOp {
    /// Its index in the whole history.
    index: usize,
    step: Step,
    call: u64,
    /// `None` for an unknown outcome: +infinity, and the operation is optional.
    ret: Option<u64>,
}

enum KeyVerdict {
    Linearizable,
    Violation(Violation),
    OutOfBudget,
}

/// The search over one key's operations, `history[i]` for each `i` in `indices`.
fn check_key(key: &str, history: &[Operation], indices: &[usize], max_steps: u64) -> KeyVerdict {
    let mut values = Values::new();
    let mut ops = Vec::with_capacity(indices.len());
    for &index in indices {
        let op = &history[index];
        let ret = (op.output != Output::Unknown).then_some(op.ret);
        let step = match (&op.input, &op.output) {
            // A failed read did nothing and tells nothing.
            (Input::Get { .. }, Output::Unknown) => continue,
            (Input::Get { .. }, Output::Value(read)) => Step::Get(values.id(read.as_deref())),
            (Input::Put { value, .. }, _) => Step::Put(values.id(Some(value))),
            (Input::Cas { expected, new, .. }, output) => Step::Cas {
                expected: values.id(expected.as_deref()),
                new: values.id(Some(new)),
                swapped: match output {
                    Output::Swapped(swapped) => Some(*swapped),
                    _ => None,
                },
            },
            // `validate` allows no other pair.
            (Input::Get { .. }, _) => continue,
        };
        ops.push(KeyOp {
            index,
            step,
            call: op.call,
            ret,
        });
    }

    let mut list = Events::new(&ops);
    let mut definite_left = ops.iter().filter(|op| op.ret.is_some()).count();
    if definite_left == 0 {
        return KeyVerdict::Linearizable;
    }
    let mut value = ABSENT;
    let mut linearized = Bitset::new(ops.len());
    // (linearized, value) states already reached: reaching one again cannot end differently.
    let mut seen: HashSet<(Bitset, Value)> = HashSet::new();
    // The linearization so far: each operation with the value before it.
    let mut stack: Vec<(usize, Value)> = Vec::new();
    let mut deepest: Option<Violation> = None;
    let mut node = list.first();
    for _ in 0..max_steps {
        match list.event(node) {
            Event::Call(op) => {
                if let Some(next) = ops[op].step.apply(value) {
                    linearized.set(op);
                    if seen.insert((linearized.clone(), next)) {
                        stack.push((op, value));
                        value = next;
                        list.lift(op);
                        if ops[op].ret.is_some() {
                            definite_left -= 1;
                            if definite_left == 0 {
                                return KeyVerdict::Linearizable;
                            }
                        }
                        node = list.first();
                        continue;
                    }
                    linearized.clear(op);
                }
                node = list.next(node);
            }
            Event::Return(op) => {
                if deepest.as_ref().is_none_or(|d| stack.len() > d.longest_prefix.len()) {
                    deepest = Some(Violation {
                        key: key.to_owned(),
                        longest_prefix: stack.iter().map(|&(op, _)| ops[op].index).collect(),
                        value: values.name(value),
                        stuck: ops[op].index,
                    });
                }
                let Some((top, before)) = stack.pop() else {
                    // Nothing left to undo: every order was tried.
                    return match deepest {
                        Some(violation) => KeyVerdict::Violation(violation),
                        None => KeyVerdict::OutOfBudget, // unreachable: recorded just above
                    };
                };
                list.unlift(top);
                linearized.clear(top);
                value = before;
                if ops[top].ret.is_some() {
                    definite_left += 1;
                }
                node = list.next(list.call_node(top));
            }
            // Only the return events of operations left to place stop a walk before the end,
            // and when none is left the search has already answered.
            Event::End => return KeyVerdict::Linearizable,
        }
    }
    KeyVerdict::OutOfBudget
}

enum Event {
    Call(usize),
    Return(usize),
    End,
}

/// A doubly linked list of one key's events in time order, from which [`Events::lift`]
/// takes an operation's events and [`Events::unlift`] puts them back (in the reverse order of
/// the lifts, so each node's own links still say where it belongs).
struct Events {
    /// Node 0 is the head and node 1 the end (sentinels); then each operation's call and, if
    /// its outcome is known, its return.
    nodes: Vec<Node>,
    /// `call_node[op]` and `return_node[op]` are the nodes of operation `op`.
    call_node: Vec<usize>,
    return_node: Vec<Option<usize>>,
}

#[derive(Clone, Copy)]
struct Node {
    /// The operation, or `usize::MAX` for a sentinel.
    op: usize,
    is_call: bool,
    prev: usize,
    next: usize,
}

const HEAD: usize = 0;
const END: usize = 1;

impl Events {
    fn new(ops: &[KeyOp]) -> Self {
        // Sorted by time; at equal times calls first, so that touching intervals overlap.
        let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * ops.len());
        for (op, key_op) in ops.iter().enumerate() {
            order.push((key_op.call, false, op));
            if let Some(ret) = key_op.ret {
                order.push((ret, true, op));
            }
        }
        order.sort_unstable();
        let sentinel = Node {
            op: usize::MAX,
            is_call: false,
            prev: HEAD,
            next: END,
        };
        let mut nodes = vec![sentinel, sentinel];
        let mut call_node = vec![0; ops.len()];
        let mut return_node = vec![None; ops.len()];
        for (_, is_return, op) in order {
            if is_return {
                return_node[op] = Some(nodes.len());
            } else {
                call_node[op] = nodes.len();
            }
            nodes.push(Node {
                op,
                is_call: !is_return,
                ..sentinel
            });
        }
        // Link the chain HEAD, 2, 3, ..., END.
        let chain: Vec<usize> = [HEAD].into_iter().chain(2..nodes.len()).chain([END]).collect();
        for pair in chain.windows(2) {
            if let &[prev, next] = pair {
                nodes[prev].next = next;
                nodes[next].prev = prev;
            }
        }
        Events {
            nodes,
            call_node,
            return_node,
        }
    }

    fn first(&self) -> usize {
        self.nodes[HEAD].next
    }

    fn next(&self, node: usize) -> usize {
        self.nodes[node].next
    }

    fn call_node(&self, op: usize) -> usize {
        self.call_node[op]
    }

    fn event(&self, node: usize) -> Event {
        let n = &self.nodes[node];
        match (node, n.is_call) {
            (END, _) => Event::End,
            (_, true) => Event::Call(n.op),
            (_, false) => Event::Return(n.op),
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call_node[op]);
        if let Some(ret) = self.return_node[op] {
            self.unlink(ret);
        }
    }

    fn unlift(&mut self, op: usize) {
        if let Some(ret) = self.return_node[op] {
            self.relink(ret);
        }
        self.relink(self.call_node[op]);
    }

    fn unlink(&mut self, node: usize) {
        let Node { prev, next, .. } = self.nodes[node];
        self.nodes[prev].next = next;
        self.nodes[next].prev = prev;
    }

    fn relink(&mut self, node: usize) {
        let Node { prev, next, .. } = self.nodes[node];
        self.nodes[prev].next = node;
        self.nodes[next].prev = node;
    }
}

/// A set of a key's operations.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bitset(Box<[u64]>);

impl Bitset {
    fn new(len: usize) -> Self {
        Bitset(vec![0; len.div_ceil(64)].into_boxed_slice())
    }

    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Who invoked a test operation and when: all of an [`Operation`] but its input and output.
    #[derive(Clone, Copy)]
    struct Call {
        client: usize,
        call: u64,
        ret: u64,
    }

    /// An operation of `client`, invoked at `call` and answered at `ret`.
    fn by(client: usize, call: u64, ret: u64) -> Call {
        Call { client, call, ret }
    }

    impl Call {
        fn put(self, key: &str, value: &str) -> Operation {
            self.operation(
                Input::Put {
                    key: key.into(),
                    value: value.into(),
                },
                Output::Ok,
            )
        }

        fn get(self, key: &str, read: Option<&str>) -> Operation {
            self.operation(Input::Get { key: key.into() }, Output::Value(read.map(str::to_owned)))
        }

        fn cas(self, key: &str, expected: Option<&str>, new: &str, swapped: bool) -> Operation {
            self.operation(
                Input::Cas {
                    key: key.into(),
                    expected: expected.map(str::to_owned),
                    new: new.into(),
                },
                Output::Swapped(swapped),
            )
        }

        fn operation(self, input: Input, output: Output) -> Operation {
            Operation {
                client: self.client,
                input,
                output,
                call: self.call,
                ret: self.ret,
            }
        }
    }

    /// A put that timed out: its `ret` is the timeout, which the checker ignores.
    fn put_unknown(client: usize, key: &str, value: &str, call: u64) -> Operation {
        Operation {
            output: Output::Unknown,
            ..by(client, call, call + 1).put(key, value)
        }
    }

    /// Table of hand-written histories, each with the property of linearizability it exercises
    /// (Herlihy & Wing 1990: a linearization is a total order of the operations, legal for the
    /// register, that respects real time; operations with unknown outcomes may be left out).
    #[test]
    fn hand_written_histories() {
        let cases: Vec<(&str, Vec<Operation>, bool)> = vec![
            ("empty history", vec![], true),
            (
                "sequential: each read sees the latest write",
                vec![
                    by(0, 0, 1).get("k", None),
                    by(0, 2, 3).put("k", "1"),
                    by(1, 4, 5).get("k", Some("1")),
                    by(1, 6, 7).put("k", "2"),
                    by(0, 8, 9).cas("k", Some("2"), "3", true),
                    by(1, 10, 11).cas("k", Some("2"), "4", false),
                    by(0, 12, 13).get("k", Some("3")),
                ],
                true,
            ),
            (
                "a read overlapping a write may see the old value",
                vec![by(0, 0, 10).put("k", "1"), by(1, 5, 15).get("k", None)],
                true,
            ),
            (
                "a read overlapping a write may see the new value",
                vec![by(0, 0, 10).put("k", "1"), by(1, 5, 15).get("k", Some("1"))],
                true,
            ),
            (
                "a read invoked when a write responds overlaps it (equal times)",
                vec![by(0, 0, 10).put("k", "1"), by(1, 10, 20).get("k", None)],
                true,
            ),
            (
                "real-time order: a read invoked after a write completed sees it (stale read)",
                vec![by(0, 0, 10).put("k", "1"), by(1, 11, 20).get("k", None)],
                false,
            ),
            (
                "a read sees only a value some write wrote",
                vec![by(0, 0, 10).put("k", "1"), by(1, 5, 15).get("k", Some("2"))],
                false,
            ),
            (
                "a lost write: acknowledged, then a later read sees the value before it",
                vec![
                    by(0, 0, 10).put("k", "1"),
                    by(0, 20, 30).put("k", "2"),
                    by(1, 40, 50).get("k", Some("1")),
                ],
                false,
            ),
            (
                "a duplicated write: applied again after a later write replaced it",
                vec![
                    by(0, 0, 10).put("k", "1"),
                    by(1, 20, 30).put("k", "2"),
                    by(2, 40, 50).get("k", Some("2")),
                    by(2, 60, 70).get("k", Some("1")),
                ],
                false,
            ),
            (
                "a duplicated timed-out write: seen, replaced, then seen again",
                vec![
                    put_unknown(0, "k", "1", 0),
                    by(1, 10, 20).get("k", Some("1")),
                    by(1, 30, 40).put("k", "2"),
                    by(2, 50, 60).get("k", Some("1")),
                ],
                false,
            ),
            (
                "reads cannot go backwards: new, then old, with one write overlapping both",
                vec![
                    by(0, 0, 100).put("k", "1"),
                    by(1, 10, 20).get("k", Some("1")),
                    by(1, 30, 40).get("k", None),
                ],
                false,
            ),
            (
                "reads by different clients cannot go backwards either",
                vec![
                    by(0, 0, 100).put("k", "1"),
                    by(1, 10, 20).get("k", Some("1")),
                    by(2, 30, 40).get("k", None),
                ],
                false,
            ),
            (
                "overlapping reads may disagree",
                vec![
                    by(0, 0, 100).put("k", "1"),
                    by(1, 10, 40).get("k", Some("1")),
                    by(2, 30, 50).get("k", None),
                ],
                true,
            ),
            (
                "a CAS cannot swap twice from the same expected value",
                vec![
                    by(0, 0, 1).put("k", "a"),
                    by(0, 2, 3).cas("k", Some("a"), "b", true),
                    by(1, 4, 5).cas("k", Some("a"), "c", true),
                ],
                false,
            ),
            (
                "of two concurrent CASes from the same value, one swaps",
                vec![
                    by(0, 0, 1).put("k", "a"),
                    by(0, 2, 10).cas("k", Some("a"), "b", true),
                    by(1, 3, 11).cas("k", Some("a"), "c", false),
                    by(2, 12, 13).get("k", Some("b")),
                ],
                true,
            ),
            (
                "a CAS expecting an absent key swaps only once",
                vec![
                    by(0, 0, 1).cas("k", None, "b", true),
                    by(1, 2, 3).cas("k", None, "c", true),
                ],
                false,
            ),
            (
                "a failed CAS saw another value than expected",
                vec![by(0, 0, 1).put("k", "a"), by(0, 2, 3).cas("k", Some("a"), "b", false)],
                false,
            ),
            (
                "a timed-out write may have taken effect",
                vec![put_unknown(0, "k", "1", 0), by(1, 10, 20).get("k", Some("1"))],
                true,
            ),
            (
                "a timed-out write may not have taken effect",
                vec![put_unknown(0, "k", "1", 0), by(1, 10, 20).get("k", None)],
                true,
            ),
            (
                "a timed-out write may take effect long after its timeout",
                vec![
                    put_unknown(0, "k", "1", 0),
                    by(1, 10, 20).get("k", None),
                    by(1, 1000, 1001).get("k", Some("1")),
                ],
                true,
            ),
            (
                "once a timed-out write is seen, a later read cannot miss it",
                vec![
                    put_unknown(0, "k", "1", 0),
                    by(1, 10, 20).get("k", Some("1")),
                    by(2, 30, 40).get("k", None),
                ],
                false,
            ),
            (
                "a timed-out write takes no effect before its call",
                vec![by(1, 0, 5).get("k", Some("1")), put_unknown(0, "k", "1", 10)],
                false,
            ),
            (
                "a timed-out CAS may have swapped",
                vec![
                    by(0, 0, 1).put("k", "a"),
                    Operation {
                        output: Output::Unknown,
                        ..by(0, 2, 3).cas("k", Some("a"), "b", true)
                    },
                    by(1, 10, 11).get("k", Some("b")),
                ],
                true,
            ),
            (
                "a failed read is ignored, whatever it would have read",
                vec![
                    by(0, 0, 1).put("k", "1"),
                    Operation {
                        output: Output::Unknown,
                        ..by(1, 5, 6).get("k", None)
                    },
                ],
                true,
            ),
            (
                "keys are independent: a write to one does not show in another",
                vec![by(0, 0, 1).put("a", "1"), by(1, 5, 6).get("b", Some("1"))],
                false,
            ),
            (
                "IRIW: two readers cannot see two independent writes in opposite orders",
                vec![
                    by(0, 0, 10).put("a", "1"),
                    by(1, 0, 10).put("b", "1"),
                    by(2, 1, 2).get("a", Some("1")),
                    by(2, 3, 4).get("b", None),
                    by(3, 1, 2).get("b", Some("1")),
                    by(3, 3, 4).get("a", None),
                ],
                false,
            ),
        ];
        for (name, history, linearizable) in cases {
            let verdict = check(&history);
            match (linearizable, &verdict) {
                (true, Verdict::Linearizable) | (false, Verdict::NotLinearizable(_)) => {}
                _ => panic!("{name}: expected linearizable = {linearizable}, got {verdict:?}"),
            }
        }
    }

    #[test]
    fn a_violation_names_the_key_the_prefix_and_the_stuck_operation() {
        let history = vec![
            by(0, 0, 1).put("other", "x"),
            by(0, 0, 10).put("k", "1"),
            by(1, 11, 12).get("k", Some("1")),
            by(1, 13, 14).get("k", Some("2")),
            by(1, 13, 14).get("other", Some("x")),
        ];
        let Verdict::NotLinearizable(violation) = check(&history) else {
            panic!("expected a violation");
        };
        assert_eq!(
            violation,
            Violation {
                key: "k".into(),
                longest_prefix: vec![1, 2],
                value: Some("1".into()),
                stuck: 3,
            }
        );
        assert_eq!(
            violation.to_string(),
            r#"key "k": after linearizing operations [1, 2] (value Some("1")), operation 3 cannot be placed"#
        );
    }

    #[test]
    fn ill_formed_histories_are_reported_as_such() {
        let mut wrong_output = by(0, 0, 1).put("k", "1");
        wrong_output.output = Output::Value(None);
        let backwards = by(0, 5, 4).get("k", None);
        let mut late_unknown = put_unknown(0, "k", "1", 5);
        late_unknown.ret = 0; // ignored: an unknown outcome never responded
        assert_eq!(
            check(&[by(0, 0, 1).put("k", "1"), wrong_output]),
            Verdict::IllFormed {
                op: 1,
                reason: "a put's output must be Ok or Unknown"
            }
        );
        assert_eq!(
            check(&[backwards]),
            Verdict::IllFormed {
                op: 0,
                reason: "response before call"
            }
        );
        assert_eq!(check(&[late_unknown]), Verdict::Linearizable);
    }

    /// A long run's shape: a client's writes and reads one after another, while timed-out
    /// writes whose values nobody read pile up (each may take effect at any later point). The
    /// search without them decides at once; with them it runs out of the same budget.
    #[test]
    fn timed_out_writes_nobody_read_do_not_exhaust_the_search() {
        let mut history = Vec::new();
        for i in 0..40u64 {
            history.push(by(0, 10 * i, 10 * i + 1).put("k", &format!("v{i}")));
            // Called after the put returned and before the read: it cannot have taken effect
            // before the read, and stays pending for the rest of the history.
            history.push(put_unknown(1 + i as usize, "k", &format!("lost{i}"), 10 * i + 2));
            history.push(by(0, 10 * i + 3, 10 * i + 4).get("k", Some(&format!("v{i}"))));
        }
        // Enough for the 80 operations with known outcomes, not for trying the 40 pending ones
        // at every later point as well.
        let budget = Budget { max_steps_per_key: 200 };
        let all: Vec<usize> = (0..history.len()).collect();
        assert!(matches!(
            check_key("k", &history, &all, budget.max_steps_per_key),
            KeyVerdict::OutOfBudget
        ));
        assert_eq!(check_with(&history, budget), Verdict::Linearizable);
        // A stale read among them is still found, by the search with them.
        history.push(by(0, 1000, 1001).get("k", Some("v3")));
        assert!(matches!(check_with(&history, Budget::default()), Verdict::NotLinearizable(v) if v.key == "k"));
    }

    /// A CAS that did not swap, explained only by a timed-out write nobody read: without that
    /// write no order works, so the search must take it in before answering.
    #[test]
    fn a_timed_out_write_nobody_read_still_explains_a_failed_cas() {
        let history = vec![
            by(0, 0, 1).put("k", "a"),
            put_unknown(1, "k", "b", 2),
            by(2, 3, 4).cas("k", Some("a"), "c", false),
        ];
        assert_eq!(without_unseen_writes(&history, &[0, 1, 2]), vec![0, 2]);
        assert_eq!(check(&history), Verdict::Linearizable);
        // Without the timed-out write, the same history is not linearizable.
        let without = vec![history[0].clone(), history[2].clone()];
        assert!(matches!(check(&without), Verdict::NotLinearizable(_)));
    }

    /// Many concurrent writes of distinct values and reads that no order satisfies: the
    /// search must give up at its budget with `Unknown`, not hang or guess.
    #[test]
    fn a_search_out_of_budget_answers_unknown() {
        let mut history: Vec<Operation> = (0..12).map(|i| by(i, 0, 100).put("k", &format!("v{i}"))).collect();
        history.push(by(20, 101, 102).get("k", Some("v0")));
        history.push(by(21, 103, 104).get("k", Some("v1")));
        history.push(by(22, 0, 1).put("z", "1"));
        let budget = Budget {
            max_steps_per_key: 1000,
        };
        assert_eq!(check_with(&history, budget), Verdict::Unknown { key: "k".into() });
        // A violation on another key still wins over a key out of budget.
        history.push(by(23, 2, 3).get("z", None));
        assert!(matches!(check_with(&history, budget), Verdict::NotLinearizable(v) if v.key == "z"));
        // With enough budget the first key is found not linearizable too.
        history.pop();
        assert!(matches!(check(&history), Verdict::NotLinearizable(v) if v.key == "k"));
    }

    /// Shape of a random history.
    struct Shape {
        clients: usize,
        ops_per_client: usize,
        keys: usize,
        values: usize,
        /// Probability that a put or CAS times out (then it takes effect half the time) or
        /// that a get fails.
        p_unknown: f64,
    }

    /// A history produced by a real execution on a sequential model: every operation takes
    /// effect at a random point of its interval (an unknown write at any point after its
    /// call, or never), and outputs are what the model answered in the order of those points.
    /// It is linearizable by construction: that order is a linearization.
    fn random_history(rng: &mut StdRng, shape: &Shape) -> Vec<Operation> {
        // (operation, point of effect if it has one)
        let mut ops: Vec<(Operation, Option<u64>)> = Vec::new();
        for client in 0..shape.clients {
            let mut now = rng.random_range(0..20);
            for _ in 0..shape.ops_per_client {
                let key = format!("k{}", rng.random_range(0..shape.keys));
                let value = |rng: &mut StdRng| format!("v{}", rng.random_range(0..shape.values));
                let input = match rng.random_range(0..10) {
                    0..4 => Input::Put { key, value: value(rng) },
                    4..8 => Input::Get { key },
                    _ => Input::Cas {
                        key,
                        expected: rng.random_bool(0.8).then(|| value(rng)),
                        new: value(rng),
                    },
                };
                let call = now + rng.random_range(0..10);
                let ret = call + rng.random_range(0..40);
                let unknown = rng.random_bool(shape.p_unknown);
                let point = match (unknown, &input) {
                    (false, _) => Some(rng.random_range(call..=ret)),
                    (true, Input::Get { .. }) => None,
                    (true, _) => rng.random_bool(0.5).then(|| call + rng.random_range(0..400)),
                };
                let output = if unknown { Output::Unknown } else { Output::Ok }; // filled in below
                ops.push((
                    Operation {
                        client,
                        input,
                        output,
                        call,
                        ret,
                    },
                    point,
                ));
                now = ret + 1;
            }
        }
        let mut order: Vec<(u64, u64, usize)> = ops
            .iter()
            .enumerate()
            .filter_map(|(i, (_, point))| point.map(|p| (p, rng.random(), i)))
            .collect();
        order.sort_unstable();
        let mut model: HashMap<String, String> = HashMap::new();
        for (_, _, i) in order {
            let op = &mut ops[i].0;
            let output = match &op.input {
                Input::Put { key, value } => {
                    model.insert(key.clone(), value.clone());
                    Output::Ok
                }
                Input::Get { key } => Output::Value(model.get(key).cloned()),
                Input::Cas { key, expected, new } => {
                    let swapped = model.get(key) == expected.as_ref();
                    if swapped {
                        model.insert(key.clone(), new.clone());
                    }
                    Output::Swapped(swapped)
                }
            };
            if op.output != Output::Unknown {
                op.output = output;
            }
        }
        ops.into_iter().map(|(op, _)| op).collect()
    }

    /// Soundness on executions that really happened: every history a real sequential store
    /// produced, with its operations overlapping at random, is accepted; and a read of a
    /// value nobody wrote, planted in it, is always rejected, on the key it was planted on.
    #[test]
    fn random_executions_are_accepted_and_a_read_of_an_unwritten_value_is_not() {
        let shape = Shape {
            clients: 5,
            ops_per_client: 12,
            keys: 2,
            values: 3,
            p_unknown: 0.1,
        };
        let mut rejected = 0;
        for seed in 0..300 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut history = random_history(&mut rng, &shape);
            assert_eq!(check(&history), Verdict::Linearizable, "seed {seed}: {history:#?}");

            let reads: Vec<usize> = (0..history.len())
                .filter(|&i| matches!(history[i].output, Output::Value(_)))
                .collect();
            if reads.is_empty() {
                continue;
            }
            let mutated = reads[rng.random_range(0..reads.len())];
            history[mutated].output = Output::Value(Some("never written".into()));
            match check(&history) {
                Verdict::NotLinearizable(violation) => {
                    assert_eq!(violation.key, history[mutated].input.key(), "seed {seed}");
                    rejected += 1;
                }
                verdict => panic!("seed {seed}: read {mutated} mutated, got {verdict:?}"),
            }
        }
        assert!(rejected > 250, "only {rejected} histories had a read to mutate");
    }

    /// The brute-force definition: some order of the operations, respecting real time, with
    /// every known-outcome operation and any subset of the others, is legal for each key's
    /// register. Exponential: for a handful of operations.
    fn linearizable_by_brute_force(history: &[Operation]) -> bool {
        let ops: Vec<&Operation> = history
            .iter()
            .filter(|op| !matches!((&op.input, &op.output), (Input::Get { .. }, Output::Unknown)))
            .collect();
        fn search(ops: &[&Operation], placed: &mut Vec<bool>, model: &mut HashMap<String, String>) -> bool {
            let definite_left =
                |placed: &[bool]| (0..ops.len()).any(|i| !placed[i] && ops[i].output != Output::Unknown);
            if !definite_left(placed) {
                return true;
            }
            for i in 0..ops.len() {
                // `i` can come next unless a remaining known operation responded before it was called.
                let blocked =
                    (0..ops.len()).any(|j| !placed[j] && ops[j].output != Output::Unknown && ops[j].ret < ops[i].call);
                if placed[i] || blocked {
                    continue;
                }
                let op = ops[i];
                let key = op.input.key().to_owned();
                let before = model.get(&key).cloned();
                let legal = match (&op.input, &op.output) {
                    (Input::Put { value, .. }, _) => {
                        model.insert(key.clone(), value.clone());
                        true
                    }
                    (Input::Get { .. }, Output::Value(read)) => *read == before,
                    (Input::Cas { expected, new, .. }, output) => {
                        let swaps = before == *expected;
                        if swaps {
                            model.insert(key.clone(), new.clone());
                        }
                        *output == Output::Unknown || *output == Output::Swapped(swaps)
                    }
                    _ => unreachable!("failed gets were filtered out"),
                };
                placed[i] = true;
                if legal && search(ops, placed, model) {
                    return true;
                }
                placed[i] = false;
                match before {
                    Some(value) => model.insert(key, value),
                    None => model.remove(&key),
                };
            }
            false
        }
        search(&ops, &mut vec![false; ops.len()], &mut HashMap::new())
    }

    /// Completeness and soundness against the definition: on small histories with arbitrary
    /// outputs (most of them not linearizable) the checker agrees with a brute-force search.
    #[test]
    fn small_arbitrary_histories_agree_with_brute_force() {
        let mut verdicts = [0; 2];
        for seed in 0..2000 {
            let mut rng = StdRng::seed_from_u64(seed);
            let len = rng.random_range(1..=7);
            let value = |rng: &mut StdRng| format!("v{}", rng.random_range(0..2));
            let history: Vec<Operation> = (0..len)
                .map(|client| {
                    let key = format!("k{}", rng.random_range(0..2));
                    let call = rng.random_range(0..20);
                    let ret = call + rng.random_range(0..15);
                    let unknown = rng.random_bool(0.15);
                    let (input, output) = match rng.random_range(0..3) {
                        0 => (
                            Input::Put {
                                key,
                                value: value(&mut rng),
                            },
                            Output::Ok,
                        ),
                        1 => (
                            Input::Get { key },
                            Output::Value(rng.random_bool(0.7).then(|| value(&mut rng))),
                        ),
                        _ => (
                            Input::Cas {
                                key,
                                expected: rng.random_bool(0.7).then(|| value(&mut rng)),
                                new: value(&mut rng),
                            },
                            Output::Swapped(rng.random_bool(0.5)),
                        ),
                    };
                    let output = if unknown { Output::Unknown } else { output };
                    Operation {
                        client,
                        input,
                        output,
                        call,
                        ret,
                    }
                })
                .collect();
            let expected = linearizable_by_brute_force(&history);
            let verdict = check(&history);
            match (expected, &verdict) {
                (true, Verdict::Linearizable) | (false, Verdict::NotLinearizable(_)) => {}
                _ => panic!("seed {seed}: brute force says {expected}, checker {verdict:?}: {history:#?}"),
            }
            verdicts[usize::from(expected)] += 1;
        }
        // Both answers are exercised, so neither half of the comparison is vacuous.
        assert!(
            verdicts[0] > 300 && verdicts[1] > 300,
            "verdicts (no, yes): {verdicts:?}"
        );
    }

    /// The search stays near-linear on a realistic history: 4,000 operations over 10 keys by
    /// 32 concurrent clients (2 or 3 operations in flight per key), with timeouts, fit in a
    /// budget of 50 steps per operation; without memoization the search needs far more. (A
    /// step count, not a time: this machine is too noisy for timed assertions. This history
    /// takes about 5,000 steps on its busiest key, and 25 ms on a debug build.)
    #[test]
    fn a_long_history_needs_few_steps_per_operation() {
        let shape = Shape {
            clients: 32,
            ops_per_client: 125,
            keys: 10,
            values: 5,
            p_unknown: 0.02,
        };
        let mut rng = StdRng::seed_from_u64(7);
        let history = random_history(&mut rng, &shape);
        assert_eq!(history.len(), 4000);
        // About 400 operations per key.
        let budget = Budget {
            max_steps_per_key: 20_000,
        };
        assert_eq!(check_with(&history, budget), Verdict::Linearizable);
    }
}
