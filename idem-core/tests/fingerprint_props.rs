//! Request fingerprints never collapse two different requests, always match the same request
//! written differently, and never crash on a deep payload: property tests against a model of
//! what "the same request" means, for `Fingerprint::of_json`. (The HTTP layer's JSON body
//! fingerprints have theirs in idem-tower's tests/body_fingerprint_props.rs.)

use idem_core::{Fingerprint, FingerprintError, MAX_FINGERPRINT_DEPTH};
use proptest::prelude::*;
use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};
use serde_json::{json, Value};

fn fp<T: Serialize + ?Sized>(value: &T) -> Fingerprint {
    Fingerprint::of_json(value).unwrap()
}

use idem_test_support::props::{big_u128, config, roll, shuffle};

// ---------------------------------------------------------------------------------------------
// `Fingerprint::of_json`: a model of typed values and of when two of them are the same request.
// ---------------------------------------------------------------------------------------------

const NAMES: [&str; 4] = ["a", "b", "1", "a b"];

/// A value built from every kind of call the serde data model has.
#[derive(Debug, Clone)]
enum Typed {
    Unit,
    None,
    Some(Box<Typed>),
    Bool(bool),
    Int(i128),
    UInt(u128),
    Float(f64),
    Str(String),
    Seq(Vec<Typed>),
    /// Entries in the order they are serialized; keys of any kind.
    Map(Vec<(Typed, Typed)>),
    /// Fields (names from `NAMES`) in the order they are serialized.
    Struct(Vec<(usize, Typed)>),
    UnitVariant(usize),
    NewtypeVariant(usize, Box<Typed>),
}

impl Serialize for Typed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Typed::Unit => s.serialize_unit(),
            Typed::None => s.serialize_none(),
            Typed::Some(inner) => s.serialize_some(inner),
            Typed::Bool(b) => s.serialize_bool(*b),
            // The narrowest width that holds the value, so widths vary with the value.
            Typed::Int(i) => match (i8::try_from(*i), i32::try_from(*i), i64::try_from(*i)) {
                (Ok(i), _, _) => s.serialize_i8(i),
                (_, Ok(i), _) => s.serialize_i32(i),
                (_, _, Ok(i)) => s.serialize_i64(i),
                _ => s.serialize_i128(*i),
            },
            Typed::UInt(u) => match (u8::try_from(*u), u16::try_from(*u), u64::try_from(*u)) {
                (Ok(u), _, _) => s.serialize_u8(u),
                (_, Ok(u), _) => s.serialize_u16(u),
                (_, _, Ok(u)) => s.serialize_u64(u),
                _ => s.serialize_u128(*u),
            },
            Typed::Float(f) => s.serialize_f64(*f),
            Typed::Str(t) => s.serialize_str(t),
            Typed::Seq(items) => s.collect_seq(items),
            Typed::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
            Typed::Struct(fields) => {
                let mut st = s.serialize_struct("S", fields.len())?;
                for (name, v) in fields {
                    st.serialize_field(NAMES[*name], v)?;
                }
                st.end()
            }
            Typed::UnitVariant(i) => s.serialize_unit_variant("E", *i as u32, NAMES[*i]),
            Typed::NewtypeVariant(i, v) => {
                s.serialize_newtype_variant("E", *i as u32, NAMES[*i], v)
            }
        }
    }
}

/// What a typed value means as a request: the documented canonical form's equalities, and
/// nothing more.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Meaning {
    Null,
    /// A `None` or `()` inside this many `Some`.
    SomeNull(usize),
    Bool(bool),
    /// Any width: the decimal value.
    Int(String),
    /// The bits, with every NaN one value.
    Float(u64),
    Str(String),
    Seq(Vec<Meaning>),
    /// Entries sorted: order does not count, duplicates do.
    Map(Vec<(Meaning, Meaning)>),
}

fn meaning(t: &Typed) -> Meaning {
    meaning_in(t, 0)
}

fn meaning_in(t: &Typed, somes: usize) -> Meaning {
    let map = |mut entries: Vec<(Meaning, Meaning)>| {
        entries.sort();
        Meaning::Map(entries)
    };
    match t {
        Typed::Unit | Typed::None if somes == 0 => Meaning::Null,
        Typed::Unit | Typed::None => Meaning::SomeNull(somes),
        Typed::Some(inner) => meaning_in(inner, somes + 1),
        Typed::Bool(b) => Meaning::Bool(*b),
        Typed::Int(i) => Meaning::Int(i.to_string()),
        Typed::UInt(u) => Meaning::Int(u.to_string()),
        Typed::Float(f) if f.is_nan() => Meaning::Float(f64::NAN.to_bits()),
        Typed::Float(f) => Meaning::Float(f.to_bits()),
        Typed::Str(s) => Meaning::Str(s.clone()),
        Typed::Seq(items) => Meaning::Seq(items.iter().map(meaning).collect()),
        Typed::Map(entries) => map(entries
            .iter()
            .map(|(k, v)| (meaning(k), meaning(v)))
            .collect()),
        // A struct is a map with string keys; variants are as serde_json writes them.
        Typed::Struct(fields) => map(fields
            .iter()
            .map(|(name, v)| (Meaning::Str(NAMES[*name].into()), meaning(v)))
            .collect()),
        Typed::UnitVariant(i) => Meaning::Str(NAMES[*i].into()),
        Typed::NewtypeVariant(i, v) => map(vec![(Meaning::Str(NAMES[*i].into()), meaning(v))]),
    }
}

/// The same request written another way: entries and fields reordered, integers in another
/// type, `()` for `None`, a struct as a map, variants as the maps and strings they equal.
fn rewrite(t: &Typed, seed: &mut u64) -> Typed {
    *seed = seed.wrapping_mul(31).wrapping_add(7);
    let flip = (*seed).is_multiple_of(3);
    match t {
        Typed::None if flip => Typed::Unit,
        Typed::Unit if flip => Typed::None,
        Typed::Some(inner) => Typed::Some(Box::new(rewrite(inner, seed))),
        Typed::Int(i) if flip && *i >= 0 => Typed::UInt(*i as u128),
        Typed::UInt(u) if flip && *u <= i128::MAX as u128 => Typed::Int(*u as i128),
        Typed::Seq(items) => Typed::Seq(items.iter().map(|i| rewrite(i, seed)).collect()),
        Typed::Map(entries) => {
            let mut entries: Vec<_> = entries
                .iter()
                .map(|(k, v)| (rewrite(k, seed), rewrite(v, seed)))
                .collect();
            shuffle(&mut entries, seed);
            Typed::Map(entries)
        }
        Typed::Struct(fields) => {
            let mut fields: Vec<_> = fields.iter().map(|(n, v)| (*n, rewrite(v, seed))).collect();
            shuffle(&mut fields, seed);
            if flip {
                Typed::Map(
                    fields
                        .into_iter()
                        .map(|(n, v)| (Typed::Str(NAMES[n].into()), v))
                        .collect(),
                )
            } else {
                Typed::Struct(fields)
            }
        }
        Typed::UnitVariant(i) if flip => Typed::Str(NAMES[*i].into()),
        Typed::NewtypeVariant(i, v) if flip => {
            Typed::Map(vec![(Typed::Str(NAMES[*i].into()), rewrite(v, seed))])
        }
        Typed::NewtypeVariant(i, v) => Typed::NewtypeVariant(*i, Box::new(rewrite(v, seed))),
        other => other.clone(),
    }
}

/// `t` with one node, deep inside or at the top, replaced by a neighbouring value: one that
/// differs a little, or is the same request written another way.
fn nudge(t: &Typed, seed: &mut u64) -> Typed {
    let r = roll(seed);
    let descend = !r.is_multiple_of(4);
    let mut t = t.clone();
    match &mut t {
        Typed::Some(inner) | Typed::NewtypeVariant(_, inner) if descend => {
            **inner = nudge(inner, seed);
        }
        Typed::Seq(items) if descend && !items.is_empty() => {
            let i = (r >> 4) as usize % items.len();
            items[i] = nudge(&items[i], seed);
        }
        Typed::Map(entries) if descend && !entries.is_empty() => {
            let i = (r >> 4) as usize % entries.len();
            let (k, v) = &mut entries[i];
            if r & 0x100 == 0 {
                *k = nudge(k, seed);
            } else {
                *v = nudge(v, seed);
            }
        }
        Typed::Struct(fields) if descend && !fields.is_empty() => {
            let i = (r >> 4) as usize % fields.len();
            let (_, v) = &mut fields[i];
            *v = nudge(v, seed);
        }
        _ => return neighbour(&t, roll(seed) % 4),
    }
    t
}

fn neighbour(t: &Typed, pick: u64) -> Typed {
    use Typed::*;
    let boxed = |t: &Typed| Box::new(t.clone());
    let mut options = match t {
        Int(i) => vec![
            Int(i.wrapping_add(1)),
            Str(i.to_string()),
            Float(*i as f64),
            Int(i.wrapping_add(1).wrapping_neg()),
        ],
        UInt(u) => vec![
            UInt(u.wrapping_add(1)),
            UInt(u.wrapping_sub(1)),
            Str(u.to_string()),
            Float(*u as f64),
        ],
        Float(f) => vec![
            Float(-f),
            Float(f64::from_bits(f.to_bits() ^ 1)),
            Unit,
            Str(f.to_string()),
        ],
        Str(s) => vec![
            Str(format!("{s}\u{0}")),
            Str(s.to_uppercase()),
            Int(s.len() as i128),
            Str(format!("\"{s}\"")),
        ],
        Unit | None => vec![Some(boxed(t)), Float(f64::NAN), Str("null".into()), Unit],
        Bool(b) => vec![Bool(!b), Str(b.to_string()), Int(*b as i128), None],
        Some(inner) => vec![
            (**inner).clone(),
            Some(boxed(t)),
            Seq(vec![(**inner).clone()]),
            Some(boxed(inner)),
        ],
        Seq(items) => {
            let mut longer = items.clone();
            longer.push(Unit);
            let indexed = items
                .iter()
                .enumerate()
                .map(|(i, v)| (UInt(i as u128), v.clone()));
            vec![
                Seq(longer),
                Seq(items.iter().rev().cloned().collect()),
                Map(indexed.collect()),
                Seq(items[..items.len().saturating_sub(1)].to_vec()),
            ]
        }
        Map(entries) => {
            let mut doubled = entries.clone();
            doubled.extend(entries.first().cloned());
            let keys_as_text = entries
                .iter()
                .map(|(k, v)| (Str(format!("{k:?}")), v.clone()));
            vec![
                Map(doubled),
                Map(entries[..entries.len().saturating_sub(1)].to_vec()),
                Map(keys_as_text.collect()),
                Seq(entries.iter().map(|(_, v)| v.clone()).collect()),
            ]
        }
        Struct(fields) => {
            let as_map = fields
                .iter()
                .map(|(n, v)| (Str(NAMES[*n].into()), v.clone()));
            let renamed = fields
                .iter()
                .map(|(n, v)| ((n + 1) % NAMES.len(), v.clone()));
            let numbered = fields.iter().map(|(n, v)| (UInt(*n as u128), v.clone()));
            vec![
                Map(as_map.collect()),
                Struct(renamed.collect()),
                Map(numbered.collect()),
                Struct(fields[..fields.len().saturating_sub(1)].to_vec()),
            ]
        }
        UnitVariant(i) => vec![
            UnitVariant((i + 1) % NAMES.len()),
            Str(NAMES[*i].into()),
            NewtypeVariant(*i, Box::new(Unit)),
            Seq(vec![Str(NAMES[*i].into())]),
        ],
        NewtypeVariant(i, v) => vec![
            Map(vec![(Str(NAMES[*i].into()), (**v).clone())]),
            NewtypeVariant((i + 1) % NAMES.len(), v.clone()),
            Seq(vec![Str(NAMES[*i].into()), (**v).clone()]),
            UnitVariant(*i),
        ],
    };
    options.swap_remove(pick as usize % 4)
}

/// Small alphabets, so that equal values come up often enough to test both directions.
fn typed() -> impl Strategy<Value = Typed> {
    let int = prop_oneof![
        (-2i128..3),
        big_u128().prop_map(|u| u as i128),
        Just(i128::MIN),
        any::<i128>()
    ];
    let uint = prop_oneof![(0u128..3), big_u128(), Just(u128::MAX)];
    let float = prop_oneof![
        prop::sample::select(vec![
            0.0,
            -0.0,
            1.0,
            0.1,
            1e16,
            f64::NAN,
            -f64::NAN,
            f64::from_bits(f64::NAN.to_bits() | 1),
            f64::INFINITY,
            f64::NEG_INFINITY,
            9007199254740992.0,
        ]),
        any::<f64>(),
    ];
    let string = prop_oneof![
        prop::sample::select(vec![
            "", "1", "a", "a b", "null", "NaN", "Infinity", "?null", "\"", "\\", "\u{0}", "é",
        ])
        .prop_map(String::from),
        prop::collection::vec(any::<char>(), 0..4).prop_map(String::from_iter),
    ];
    let leaf = prop_oneof![
        Just(Typed::Unit),
        Just(Typed::None),
        any::<bool>().prop_map(Typed::Bool),
        int.prop_map(Typed::Int),
        uint.prop_map(Typed::UInt),
        float.prop_map(Typed::Float),
        string.prop_map(Typed::Str),
        (0..NAMES.len()).prop_map(Typed::UnitVariant),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|t| Typed::Some(Box::new(t))),
            prop::collection::vec(inner.clone(), 0..4).prop_map(Typed::Seq),
            prop::collection::vec((inner.clone(), inner.clone()), 0..4).prop_map(Typed::Map),
            prop::collection::vec((0..NAMES.len(), inner.clone()), 0..4).prop_map(Typed::Struct),
            (0..NAMES.len(), inner).prop_map(|(i, t)| Typed::NewtypeVariant(i, Box::new(t))),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    /// Two values share a fingerprint exactly when they mean the same request.
    #[test]
    fn same_fingerprint_iff_same_value(a in typed(), b in typed()) {
        prop_assert_eq!(fp(&a) == fp(&b), meaning(&a) == meaning(&b), "{:?} vs {:?}", a, b);
    }

    /// A value and a near miss (one node changed a little, or written another way) share a
    /// fingerprint exactly when they mean the same request.
    #[test]
    fn near_misses_differ(a in typed(), mut seed: u64) {
        let b = nudge(&rewrite(&a, &mut seed), &mut seed);
        prop_assert_eq!(fp(&a) == fp(&b), meaning(&a) == meaning(&b), "{:?} vs {:?}", a, b);
    }

    /// Reordered entries and fields, other integer types, a struct as a map: same fingerprint.
    #[test]
    fn rewritten_value_keeps_its_fingerprint(a in typed(), mut seed: u64) {
        let b = rewrite(&a, &mut seed);
        prop_assert_eq!(meaning(&a), meaning(&b));
        prop_assert_eq!(fp(&a), fp(&b), "{:?} vs {:?}", a, b);
    }

    /// Distinct integers, including beyond 2^64 and past f64 precision, never share one; the
    /// same integer in any width does.
    #[test]
    fn distinct_integers_differ(x in big_u128(), y: i128) {
        prop_assert_ne!(fp(&x), fp(&(x + 1)));
        prop_assert_ne!(fp(&y), fp(&y.wrapping_add(1)));
        if let Ok(signed) = i128::try_from(x) {
            prop_assert_ne!(fp(&x), fp(&-signed));
        }
        if let Ok(small) = u64::try_from(x) {
            prop_assert_eq!(fp(&x), fp(&small));
            prop_assert_eq!(fp(&x), fp(&json!(small)));
            prop_assert_eq!(fp(&x), fp(&(x as i128)));
        }
        if let Ok(small) = i64::try_from(y) {
            prop_assert_eq!(fp(&y), fp(&small));
            prop_assert_eq!(fp(&y), fp(&json!(small)));
        }
    }

    /// Distinct floats (by bits; all NaNs are one value) never share one, nor with null.
    #[test]
    fn distinct_floats_differ(a: f64, b: f64, c: f32, d: f32) {
        let same = |x: f64, y: f64| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
        prop_assert_eq!(fp(&a) == fp(&b), same(a, b));
        prop_assert_eq!(fp(&c) == fp(&d), same(f64::from(c), f64::from(d)));
        prop_assert_ne!(fp(&a), fp(&()));
        prop_assert_ne!(fp(&Some(a)), fp(&None::<f64>));
    }

    /// A map key is typed: the integer `k` differs from the string `"k"`, and distinct keys
    /// never share a fingerprint.
    #[test]
    fn map_keys_are_typed(k: i64, j: i64, v: u8) {
        use std::collections::BTreeMap;
        let int = fp(&BTreeMap::from([(k, v)]));
        prop_assert_ne!(int, fp(&BTreeMap::from([(k.to_string(), v)])));
        prop_assert_eq!(int == fp(&BTreeMap::from([(j, v)])), k == j);
        prop_assert_eq!(
            fp(&BTreeMap::from([(k.to_string(), v)])) == fp(&BTreeMap::from([(j.to_string(), v)])),
            k == j
        );
    }
}

#[test]
fn nan_infinities_and_null_are_all_distinct() {
    let values = [
        fp(&f64::NAN),
        fp(&f64::INFINITY),
        fp(&f64::NEG_INFINITY),
        fp(&-0.0),
        fp(&0.0),
        fp(&0),
        fp(&()),
        fp(&Some(None::<f64>)),
        fp(&false),
        fp(&"NaN"),
        fp(&"Infinity"),
        fp(&"-Infinity"),
        fp(&"null"),
    ];
    for (i, a) in values.iter().enumerate() {
        for b in &values[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert_eq!(fp(&()), fp(&None::<f64>));
    assert_eq!(fp(&()), fp(&Value::Null));
    assert_eq!(fp(&f64::NAN), fp(&f32::NAN));
    assert_eq!(fp(&f64::INFINITY), fp(&f32::INFINITY));
}

#[test]
fn struct_equals_json_object() {
    #[derive(serde::Serialize)]
    struct Deposit {
        account: u32,
        cents: u64,
        note: Option<String>,
        rate: f32,
    }
    let typed = Deposit {
        account: 1,
        cents: 500,
        note: None,
        rate: 0.5,
    };
    let json = json!({"rate": 0.5, "note": null, "cents": 500, "account": 1});
    assert_eq!(fp(&typed), fp(&json));
}

// ---------------------------------------------------------------------------------------------
// Depth: a deep value is a typed error, never a stack overflow.
// ---------------------------------------------------------------------------------------------

const DEEP: usize = 100_000;

fn too_deep() -> Result<Fingerprint, FingerprintError> {
    Err(FingerprintError::TooDeep {
        limit: MAX_FINGERPRINT_DEPTH,
    })
}

/// Takes a nested value apart level by level: dropping it whole would recurse once per level.
fn dismantle(mut value: Value) {
    loop {
        value = match value {
            Value::Array(mut items) => match items.pop() {
                Some(inner) => inner,
                None => return,
            },
            Value::Object(mut map) => match map.remove("a") {
                Some(inner) => inner,
                None => return,
            },
            _ => return,
        };
    }
}

#[test]
fn deep_json_value_is_a_typed_error() {
    let mut arrays = Value::Null;
    let mut objects = Value::Null;
    for _ in 0..DEEP {
        arrays = Value::Array(vec![arrays]);
        let mut map = serde_json::Map::new();
        map.insert("a".into(), objects);
        objects = Value::Object(map);
    }
    assert_eq!(Fingerprint::of_json(&arrays), too_deep());
    assert_eq!(Fingerprint::of_json(&objects), too_deep());
    dismantle(arrays);
    dismantle(objects);
}

#[test]
fn deep_user_types_are_a_typed_error() {
    /// Nests through `Some` and a newtype, with no container in between.
    #[derive(serde::Serialize)]
    struct Chain(Option<Box<Chain>>);
    #[derive(serde::Serialize)]
    enum List {
        Nil,
        Cons(u32, Box<List>),
    }

    let mut chain = Chain(None);
    let mut list = List::Nil;
    for i in 0..DEEP {
        chain = Chain(Some(Box::new(chain)));
        list = List::Cons(i as u32, Box::new(list));
    }
    assert_eq!(Fingerprint::of_json(&chain), too_deep());
    assert_eq!(Fingerprint::of_json(&list), too_deep());

    let mut next = chain.0.take();
    while let Some(mut link) = next {
        next = link.0.take();
    }
    while let List::Cons(_, tail) = list {
        list = *tail;
    }
}

#[test]
fn whatever_serde_json_reads_fits_the_depth_bound() {
    for n in 1..=MAX_FINGERPRINT_DEPTH + 2 {
        let text = "[".repeat(n) + &"]".repeat(n);
        if let Ok(value) = serde_json::from_str::<Value>(&text) {
            assert!(Fingerprint::of_json(&value).is_ok(), "depth {n}");
        }
    }
}
