//! A `serde::Serializer` that writes the canonical form directly, with no `serde_json::Value`
//! in between (which would round big integers to `f64`, turn NaN and infinities into `null`
//! and turn every map key into a string).

use serde::ser::{self, Serialize};

use super::{enter, write_str};
use crate::canonical::FingerprintError;

/// The canonical form of `value`.
pub(crate) fn to_canonical<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    value.serialize(Canonical {
        out: &mut out,
        depth: 0,
        somes: 0,
        key_text: None,
    })?;
    Ok(out)
}

/// A `Serialize` value behind a trait object, so that one slice can hold values of different
/// types: the fields of [`struct_to_canonical`].
pub(crate) trait DynSerialize {
    /// Writes the canonical form of `self`, nested `depth` levels deep, to `out`.
    fn write_canonical(&self, out: &mut Vec<u8>, depth: usize) -> Result<()>;
}

impl<T: Serialize> DynSerialize for T {
    fn write_canonical(&self, out: &mut Vec<u8>, depth: usize) -> Result<()> {
        self.serialize(Canonical::child(out, depth))
    }
}

/// The canonical form of a struct with these fields (name and value), the same as that of a
/// `Serialize` struct with the same fields and values.
pub(crate) fn struct_to_canonical<'a>(
    fields: impl IntoIterator<Item = (&'a str, &'a dyn DynSerialize)>,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut map = Canonical::child(&mut out, 0).map(b"}")?;
    for (name, value) in fields {
        let mut encoded = Vec::new();
        value.write_canonical(&mut encoded, map.depth)?;
        map.push_field(name, encoded);
    }
    map.close()?;
    Ok(out)
}

/// Writes one value.
struct Canonical<'a> {
    out: &'a mut Vec<u8>,
    /// How many containers and wrappers enclose this value.
    depth: usize,
    /// How many `Some` directly wrap this value: a `null` inside them is marked once per `Some`,
    /// so `Some(None)` differs from `None` (JSON writes both as `null`).
    somes: usize,
    /// For a map key: receives the key's text when the key is a string, which orders it.
    key_text: Option<&'a mut Option<String>>,
}

type Result<T> = std::result::Result<T, FingerprintError>;

impl<'a> Canonical<'a> {
    /// A writer for a value nested inside this one (an element, field or map value).
    fn child(out: &mut Vec<u8>, depth: usize) -> Canonical<'_> {
        Canonical {
            out,
            depth,
            somes: 0,
            key_text: None,
        }
    }

    /// A writer for the value this one wraps transparently (`Some`, a newtype struct), one
    /// level deeper.
    fn wrapped(self, somes: usize) -> Result<Canonical<'a>> {
        Ok(Canonical {
            depth: enter(self.depth)?,
            somes,
            ..self
        })
    }

    fn text(self, s: &str) -> Result<()> {
        write_str(self.out, s);
        if let Some(slot) = self.key_text {
            *slot = Some(s.to_owned());
        }
        Ok(())
    }

    fn integer(self, i: impl itoa::Integer) -> Result<()> {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
        Ok(())
    }

    fn null(self) -> Result<()> {
        self.out.resize(self.out.len() + self.somes, b'?');
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    /// Opens `{"variant":` around a variant's data, one level deeper.
    fn variant(self, variant: &str) -> Result<(&'a mut Vec<u8>, usize)> {
        let depth = enter(self.depth)?;
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.push(b':');
        Ok((self.out, depth))
    }

    fn seq(self, closing: &'static [u8]) -> Result<Seq<'a>> {
        let depth = enter(self.depth)?;
        self.out.push(b'[');
        Ok(Seq {
            out: self.out,
            depth,
            first: true,
            closing,
        })
    }

    fn map(self, closing: &'static [u8]) -> Result<Map<'a>> {
        Ok(Map {
            depth: enter(self.depth)?,
            out: self.out,
            entries: Vec::new(),
            key: None,
            closing,
        })
    }
}

impl<'a> ser::Serializer for Canonical<'a> {
    type Ok = ();
    type Error = FingerprintError;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Map<'a>;
    type SerializeStruct = Map<'a>;
    type SerializeStructVariant = Map<'a>;

    fn serialize_bool(self, v: bool) -> Result<()> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<()> {
        self.integer(v)
    }

    fn serialize_i16(self, v: i16) -> Result<()> {
        self.integer(v)
    }

    fn serialize_i32(self, v: i32) -> Result<()> {
        self.integer(v)
    }

    fn serialize_i64(self, v: i64) -> Result<()> {
        self.integer(v)
    }

    fn serialize_i128(self, v: i128) -> Result<()> {
        self.integer(v)
    }

    fn serialize_u8(self, v: u8) -> Result<()> {
        self.integer(v)
    }

    fn serialize_u16(self, v: u16) -> Result<()> {
        self.integer(v)
    }

    fn serialize_u32(self, v: u32) -> Result<()> {
        self.integer(v)
    }

    fn serialize_u64(self, v: u64) -> Result<()> {
        self.integer(v)
    }

    fn serialize_u128(self, v: u128) -> Result<()> {
        self.integer(v)
    }

    /// Widened to `f64`, which is exact: an `f32` field hashes as serde_json's `Value` of it does.
    fn serialize_f32(self, v: f32) -> Result<()> {
        self.serialize_f64(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<()> {
        // Shortest round-trip text (what serde_json writes), so distinct floats never share
        // text; the non-finite values get words that no number or string can be.
        let mut buffer = zmij::Buffer::new();
        let text = if v.is_nan() {
            "NaN"
        } else if v == f64::INFINITY {
            "Infinity"
        } else if v == f64::NEG_INFINITY {
            "-Infinity"
        } else {
            buffer.format_finite(v)
        };
        self.out.extend_from_slice(text.as_bytes());
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<()> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, v: &str) -> Result<()> {
        self.text(v)
    }

    /// As serde_json writes bytes: an array of numbers, like a `Vec<u8>`.
    fn serialize_bytes(self, v: &[u8]) -> Result<()> {
        self.out.push(b'[');
        for (i, b) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out
                .extend_from_slice(itoa::Buffer::new().format(*b).as_bytes());
        }
        self.out.push(b']');
        Ok(())
    }

    fn serialize_none(self) -> Result<()> {
        self.null()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<()> {
        let somes = self.somes + 1;
        value.serialize(self.wrapped(somes)?)
    }

    fn serialize_unit(self) -> Result<()> {
        self.null()
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<()> {
        self.null()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<()> {
        self.text(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<()> {
        // Keeps `somes`, so `Some(Wrapper(None))` still differs from `None`.
        let somes = self.somes;
        value.serialize(self.wrapped(somes)?)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<()> {
        let (out, depth) = self.variant(variant)?;
        value.serialize(Canonical::child(out, depth))?;
        out.push(b'}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>> {
        self.seq(b"]")
    }

    fn serialize_tuple(self, _len: usize) -> Result<Seq<'a>> {
        self.seq(b"]")
    }

    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Seq<'a>> {
        self.seq(b"]")
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>> {
        let (out, depth) = self.variant(variant)?;
        out.push(b'[');
        Ok(Seq {
            out,
            depth,
            first: true,
            closing: b"]}",
        })
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Map<'a>> {
        self.map(b"}")
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Map<'a>> {
        self.map(b"}")
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Map<'a>> {
        let (out, depth) = self.variant(variant)?;
        Ok(Map {
            out,
            depth,
            entries: Vec::new(),
            key: None,
            closing: b"}}",
        })
    }
}

/// Writes the elements of a sequence, tuple or tuple variant as they come.
struct Seq<'a> {
    out: &'a mut Vec<u8>,
    /// The depth of the elements.
    depth: usize,
    first: bool,
    /// What `end` writes: `]`, or `]}` after a variant's data.
    closing: &'static [u8],
}

impl Seq<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
        value.serialize(Canonical::child(self.out, self.depth))
    }

    fn close(self) -> Result<()> {
        self.out.extend_from_slice(self.closing);
        Ok(())
    }
}

macro_rules! seq_impl {
    ($trait:ident, $method:ident) => {
        impl ser::$trait for Seq<'_> {
            type Ok = ();
            type Error = FingerprintError;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
                self.element(value)
            }

            fn end(self) -> Result<()> {
                self.close()
            }
        }
    };
}

seq_impl!(SerializeSeq, serialize_element);
seq_impl!(SerializeTuple, serialize_element);
seq_impl!(SerializeTupleStruct, serialize_field);
seq_impl!(SerializeTupleVariant, serialize_field);

/// One map entry or struct field, in canonical form.
struct Entry {
    /// The key's text when the key is a string: string keys sort by it, first.
    text: Option<String>,
    key: Vec<u8>,
    value: Vec<u8>,
}

/// Collects the entries of a map, struct or struct variant, and writes them sorted at the end
/// (sorted by the key's text for string keys, as earlier releases sorted every key).
struct Map<'a> {
    out: &'a mut Vec<u8>,
    /// The depth of the keys and values.
    depth: usize,
    entries: Vec<Entry>,
    /// The key whose value comes next.
    key: Option<(Option<String>, Vec<u8>)>,
    /// What `end` writes: `}`, or `}}` after a variant's data.
    closing: &'static [u8],
}

impl Map<'_> {
    fn value_of<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        value.serialize(Canonical::child(&mut out, self.depth))?;
        Ok(out)
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<()> {
        let value = self.value_of(value)?;
        self.push_field(key, value);
        Ok(())
    }

    /// Adds the field `key` with its value already in canonical form.
    fn push_field(&mut self, key: &str, value: Vec<u8>) {
        let mut encoded = Vec::new();
        write_str(&mut encoded, key);
        self.entries.push(Entry {
            text: Some(key.to_owned()),
            key: encoded,
            value,
        });
    }

    fn close(mut self) -> Result<()> {
        if self.key.is_some() {
            return Err(FingerprintError::Serialize(
                "a map key was serialized without its value".into(),
            ));
        }
        // Equal keys (a map type that allows duplicates) are ordered by value, so the form
        // does not depend on the order the entries came in.
        fn order(e: &Entry) -> (bool, &[u8]) {
            match &e.text {
                Some(text) => (false, text.as_bytes()),
                None => (true, &e.key),
            }
        }
        self.entries
            .sort_unstable_by(|a, b| order(a).cmp(&order(b)).then_with(|| a.value.cmp(&b.value)));
        self.out.push(b'{');
        for (i, entry) in self.entries.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out.extend_from_slice(&entry.key);
            self.out.push(b':');
            self.out.extend_from_slice(&entry.value);
        }
        self.out.extend_from_slice(self.closing);
        Ok(())
    }
}

impl ser::SerializeMap for Map<'_> {
    type Ok = ();
    type Error = FingerprintError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<()> {
        let (mut encoded, mut text) = (Vec::new(), None);
        key.serialize(Canonical {
            out: &mut encoded,
            depth: self.depth,
            somes: 0,
            key_text: Some(&mut text),
        })?;
        self.key = Some((text, encoded));
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        let Some((text, key)) = self.key.take() else {
            return Err(FingerprintError::Serialize(
                "a map value was serialized without a key".into(),
            ));
        };
        let value = self.value_of(value)?;
        self.entries.push(Entry { text, key, value });
        Ok(())
    }

    fn end(self) -> Result<()> {
        self.close()
    }
}

macro_rules! struct_impl {
    ($trait:ident) => {
        impl ser::$trait for Map<'_> {
            type Ok = ();
            type Error = FingerprintError;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<()> {
                self.field(key, value)
            }

            fn end(self) -> Result<()> {
                self.close()
            }
        }
    };
}

struct_impl!(SerializeStruct);
struct_impl!(SerializeStructVariant);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;
    use serde_json::json;

    use super::*;

    fn text<T: Serialize + ?Sized>(value: &T) -> String {
        String::from_utf8(to_canonical(value).unwrap()).unwrap()
    }

    /// The canonical form is stored (hashed) in records: these pin it, so a change to it (or to
    /// a formatter it uses) fails here rather than silently changing stored fingerprints.
    #[test]
    fn pinned_forms() {
        #[derive(Serialize)]
        enum E {
            Unit,
            New(u8),
            Tuple(u8, u8),
            Struct { b: u8, a: u8 },
        }
        #[derive(Serialize)]
        struct Unit;
        #[derive(Serialize)]
        struct Wrap(Option<u8>);
        #[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
        #[serde(untagged)]
        enum Key {
            Int(u8),
            Str(&'static str),
        }
        let cases: Vec<(String, &str)> = vec![
            (
                text(&json!({"b": [1, -2, 1.5], "a": null, "c": "q\"\n"})),
                r#"{"a":null,"b":[1,-2,1.5],"c":"q\"\n"}"#,
            ),
            (text(&u128::MAX), "340282366920938463463374607431768211455"),
            (text(&i128::MIN), "-170141183460469231731687303715884105728"),
            (
                text(&[0.1, 1.0, -0.0, 1e16, 1e-7, 5e-324]),
                "[0.1,1.0,-0.0,1e+16,1e-7,5e-324]",
            ),
            (text(&0.1f32), "0.10000000149011612"),
            (
                text(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY]),
                "[NaN,Infinity,-Infinity]",
            ),
            (
                text(&(
                    None::<u8>,
                    Some(None::<u8>),
                    Some(Some(None::<u8>)),
                    Some(5),
                )),
                "[null,?null,??null,5]",
            ),
            (
                text(&(Unit, (), Some(()), Some(Wrap(None)), Wrap(Some(1)))),
                "[null,null,?null,?null,1]",
            ),
            (
                text(&[E::Unit, E::New(1), E::Tuple(1, 2), E::Struct { b: 2, a: 1 }]),
                r#"["Unit",{"New":1},{"Tuple":[1,2]},{"Struct":{"a":1,"b":2}}]"#,
            ),
            (
                text(&BTreeMap::from([(10, 'x'), (9, 'y')])),
                r#"{10:"x",9:"y"}"#,
            ),
            (
                text(&BTreeMap::from([
                    (Key::Int(1), 0),
                    (Key::Str("1"), 0),
                    (Key::Str("a b"), 0),
                    (Key::Str("a"), 0),
                ])),
                r#"{"1":0,"a":0,"a b":0,1:0}"#,
            ),
            (
                text(&BTreeMap::from([((1, 2), "t"), ((0, 3), "u")])),
                r#"{[0,3]:"u",[1,2]:"t"}"#,
            ),
            (text(&Bytes(&[1, 255])), "[1,255]"),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    /// Fields of erased types make the same form as a struct with those fields, nested values
    /// included, and count their depth the same way.
    #[test]
    fn erased_fields_write_a_struct() {
        #[derive(Serialize)]
        struct Charge<'a> {
            order: &'a str,
            cents: u64,
            tags: Vec<Option<u8>>,
        }
        let (order, cents, tags) = ("o-1", 100u64, vec![Some(1), None]);
        let fields: [(&str, &dyn DynSerialize); 3] =
            [("order", &order), ("cents", &cents), ("tags", &tags)];
        let erased = struct_to_canonical(fields).unwrap();
        assert_eq!(
            String::from_utf8(erased).unwrap(),
            text(&Charge {
                order,
                cents,
                tags: tags.clone()
            })
        );
        assert_eq!(
            text(&Charge { order, cents, tags }),
            r#"{"cents":100,"order":"o-1","tags":[1,null]}"#
        );
        assert_eq!(struct_to_canonical([]).unwrap(), b"{}");

        let mut deep = json!(0);
        for _ in 0..crate::canonical::MAX_FINGERPRINT_DEPTH - 1 {
            deep = json!([deep]);
        }
        assert!(struct_to_canonical([("deep", &deep as &dyn DynSerialize)]).is_ok());
        let deeper = json!([deep]);
        assert!(to_canonical(&json!({ "deeper": deeper })).is_err());
        assert!(struct_to_canonical([("deeper", &deeper as &dyn DynSerialize)]).is_err());
    }

    /// A byte string, sent through `serialize_bytes` as `serde_bytes` does.
    struct Bytes<'a>(&'a [u8]);

    impl Serialize for Bytes<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }
}
