//! What the function's parameters mean to the attribute: which of them the default fingerprint
//! hashes, and which a detached body would borrow.

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{
    Expr, ExprLit, FnArg, GenericArgument, Ident, Lifetime, Lit, Pat, PathArguments, Signature,
    Token, Type, TypeParamBound, UnOp,
};

/// What the attribute's arguments name, which the default fingerprint leaves out.
pub(crate) struct NotHashed<'a> {
    pub(crate) engine: Option<&'a Expr>,
    pub(crate) key: Option<&'a Expr>,
    pub(crate) caller: Option<&'a Expr>,
    pub(crate) transaction: Option<&'a Ident>,
    /// The names given in `skip(…)`.
    pub(crate) skip: &'a [Ident],
}

/// The methods a key may be built through and still be the whole argument it is called on:
/// each gives the same value in another type, so two different arguments never give one key.
const CONVERSIONS: [&str; 7] = [
    "as_ref",
    "as_str",
    "as_deref",
    "borrow",
    "clone",
    "to_owned",
    "to_string",
];

/// The names bound by the parameters, in order, that the default fingerprint hashes: all but
/// the receiver, the one `engine` is taken from (`state` in `engine = state.idem`), the ones the
/// key or the caller is built from whole (see [`built_from`]), the `transaction` parameter, and
/// those `skip(…)` names.
///
/// A name in `skip(…)` that no parameter binds, `self`, or one left out already is an error on
/// that name, saying why.
pub(crate) fn hashed(sig: &Signature, not_hashed: &NotHashed<'_>) -> syn::Result<Vec<Ident>> {
    let mut left_out: Vec<(Ident, &str)> = Vec::new();
    if let Some(engine) = not_hashed.engine.and_then(root) {
        left_out.push((engine.clone(), "the engine is taken from it"));
    }
    for (expr, why) in [
        (not_hashed.key, "the key is built from it"),
        (not_hashed.caller, "the caller is built from it"),
    ] {
        let mut names = Vec::new();
        if let Some(expr) = expr {
            built_from(expr, &mut names);
        }
        left_out.extend(names.into_iter().map(|name| (name, why)));
    }
    if let Some(transaction) = not_hashed.transaction {
        left_out.push((transaction.clone(), "it is the transaction"));
    }
    let mut names = Vec::new();
    for input in &sig.inputs {
        if let FnArg::Typed(typed) = input {
            bindings(&typed.pat, &mut names);
        }
    }
    let errors = not_hashed
        .skip
        .iter()
        .filter_map(|skipped| check_skipped(sig, &names, &left_out, skipped));
    crate::expand::combine_errors(errors)?;
    names.retain(|name| {
        let out = |other: &Ident| other.unraw() == name.unraw();
        !left_out.iter().any(|(other, _)| out(other)) && !not_hashed.skip.iter().any(out)
    });
    Ok(names)
}

/// The error for a name in `skip(…)` that the default fingerprint would not hash anyway.
fn check_skipped(
    sig: &Signature,
    names: &[Ident],
    left_out: &[(Ident, &str)],
    skipped: &Ident,
) -> Option<syn::Error> {
    let name = skipped.unraw();
    let receiver = sig.receiver().is_some() && name == "self";
    if receiver {
        let message = "`self` is never part of the default fingerprint: remove it from `skip`";
        return Some(syn::Error::new(skipped.span(), message));
    }
    if !names.iter().any(|n| n.unraw() == name) {
        let message = match names {
            [] => format!(
                "`skip` names `{name}`, but `{}` has no argument to hash: remove `skip`",
                sig.ident.unraw()
            ),
            _ => format!(
                "`skip` names `{name}`, which is not an argument of `{}`; its arguments are {}",
                sig.ident.unraw(),
                names
                    .iter()
                    .map(|n| format!("`{}`", n.unraw()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        return Some(syn::Error::new(skipped.span(), message));
    }
    let (_, why) = left_out.iter().find(|(out, _)| out.unraw() == name)?;
    Some(syn::Error::new(
        skipped.span(),
        format!(
            "`{name}` is left out of the default fingerprint already, as {why}: remove it from \
             `skip`"
        ),
    ))
}

/// The names a parameter's pattern binds: `x` in `x: T` and `mut x: T`, `a` and `b` in
/// `(a, b): (A, B)` or `Json(Order { a, b }): Json<Order>`; none for `_`.
fn bindings(pat: &Pat, names: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            names.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, names);
            }
        }
        Pat::Reference(p) => bindings(&p.pat, names),
        Pat::Paren(p) => bindings(&p.pat, names),
        Pat::Type(p) => bindings(&p.pat, names),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bindings(&f.pat, names)),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| bindings(e, names)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| bindings(e, names)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| bindings(e, names)),
        // Every case of an irrefutable or-pattern binds the same names.
        Pat::Or(p) => {
            if let Some(first) = p.cases.first() {
                bindings(first, names);
            }
        }
        _ => {}
    }
}

/// The variable an expression is, through `&`, `*` and parentheses: `id` in `id`, `&id`, `*id`.
fn whole(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        Expr::Reference(r) => whole(&r.expr),
        Expr::Unary(u) if matches!(u.op, UnOp::Deref(_)) => whole(&u.expr),
        Expr::Paren(p) => whole(&p.expr),
        Expr::Group(g) => whole(&g.expr),
        _ => None,
    }
}

/// Adds to `names` the variables a key (or caller) expression is built from whole, so that the
/// key tells two of their values apart: the variable itself (`id`, `&id`), a [`CONVERSIONS`]
/// method called on one (`id.as_ref()`, `n.to_string()`), and the arguments of `format!`, named,
/// positional or captured (`format!("{tenant}-{}", id)`), each built so. Not a variable whose
/// field, index or other method the key reads (`req` in `req.id`, `req.id()`, `id.trim()`), nor
/// one passed to a function or another macro: the key then tells only part of it apart, and the
/// rest of it is request data the fingerprint must hash.
fn built_from(expr: &Expr, names: &mut Vec<Ident>) {
    match expr {
        Expr::Path(_) => names.extend(whole(expr).cloned()),
        Expr::Reference(r) => built_from(&r.expr, names),
        Expr::Unary(u) if matches!(u.op, UnOp::Deref(_)) => built_from(&u.expr, names),
        Expr::Paren(p) => built_from(&p.expr, names),
        Expr::Group(g) => built_from(&g.expr, names),
        Expr::MethodCall(m) if m.args.is_empty() && CONVERSIONS.iter().any(|c| m.method == c) => {
            built_from(&m.receiver, names);
        }
        Expr::Macro(m)
            if m.mac
                .path
                .segments
                .last()
                .is_some_and(|s| s.ident == "format") =>
        {
            format_arguments(&m.mac.tokens, names);
        }
        _ => {}
    }
}

/// The variables `format!(<tokens>)` writes whole into its text: its arguments, as
/// [`built_from`] reads them, and the names the format string captures (`{id}`, `{id:>8}`);
/// none when a width or precision is read from an argument.
fn format_arguments(tokens: &TokenStream, names: &mut Vec<Ident>) {
    let Ok(arguments) = Punctuated::<Expr, Token![,]>::parse_terminated.parse2(tokens.clone())
    else {
        return;
    };
    let mut arguments = arguments.into_iter();
    let Some(Expr::Lit(ExprLit {
        lit: Lit::Str(format),
        ..
    })) = arguments.next()
    else {
        return;
    };
    // A width or precision taken from an argument (`{:w$}`, `{:.*}`) pads the text instead of
    // writing that argument: then no argument is counted, rather than telling them apart.
    let text = format.value();
    if text.contains('$') || text.contains(".*") {
        return;
    }
    let mut named = Vec::new();
    for argument in arguments {
        match argument {
            Expr::Assign(assign) => {
                named.extend(whole(&assign.left).cloned());
                built_from(&assign.right, names);
            }
            positional => built_from(&positional, names),
        }
    }
    for captured in captures(&text) {
        if !named.iter().any(|n| n == captured) {
            names.push(Ident::new(captured, format.span()));
        }
    }
}

/// The names a format string captures as a value to write: `id` in `"{id}"` and `"{id:?}"`, but
/// not an index (`{0}`) or an escaped brace (`{{id}}`).
fn captures(format: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = format;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(escaped) = rest.strip_prefix('{') {
            rest = escaped;
            continue;
        }
        let end = rest.find(['}', ':']).unwrap_or(rest.len());
        let name = rest[..end].trim();
        let identifier = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name != "_";
        if identifier {
            names.push(name);
        }
        rest = &rest[end..];
    }
    names
}

/// The variable an expression is taken from: `state` in `state.idem`, `&state.idem` or
/// `state.engine()`.
fn root(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Field(f) => root(&f.base),
        Expr::MethodCall(m) => root(&m.receiver),
        Expr::Index(i) => root(&i.expr),
        Expr::Reference(r) => root(&r.expr),
        Expr::Unary(u) if matches!(u.op, UnOp::Deref(_)) => root(&u.expr),
        Expr::Paren(p) => root(&p.expr),
        Expr::Group(g) => root(&g.expr),
        _ => whole(expr),
    }
}

/// With `detach = true`: an error on every parameter that borrows and that the body uses, since
/// the detached body must own what it uses (rustc's own error, "borrowed data escapes", does
/// not say why).
pub(crate) fn check_detached(sig: &Signature, body: &TokenStream) -> Vec<syn::Error> {
    let mut errors = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => {
                if borrows(&receiver.ty) && mentions(body, "self") {
                    errors.push(syn::Error::new_spanned(
                        receiver,
                        "`detach = true` runs the body on a task of its own, which must own \
                         what it uses, but the body uses `self`, which is borrowed: take \
                         `self: Arc<Self>` instead (and call the method on an `Arc`), or remove \
                         `detach`",
                    ));
                }
            }
            FnArg::Typed(typed) => {
                if !borrows(&typed.ty) {
                    continue;
                }
                let mut names = Vec::new();
                bindings(&typed.pat, &mut names);
                let Some(used) = names
                    .iter()
                    .find(|name| mentions(body, &name.unraw().to_string()))
                else {
                    continue;
                };
                errors.push(syn::Error::new_spanned(
                    typed,
                    format!(
                        "`detach = true` runs the body on a task of its own, which must own what \
                         it uses, but the body uses `{}`, which is borrowed: {}, or remove \
                         `detach`",
                        used.unraw(),
                        owned_instead(&typed.ty),
                    ),
                ));
            }
        }
    }
    errors
}

/// What to take instead of a borrowing type.
fn owned_instead(ty: &Type) -> String {
    let Type::Reference(reference) = ty else {
        return "take an owned type instead (one with no lifetime but `'static`)".into();
    };
    match &*reference.elem {
        Type::Path(p) if p.path.is_ident("str") => "take `String` instead of `&str`".into(),
        Type::Path(p) if p.path.is_ident("Path") => "take `PathBuf` instead of `&Path`".into(),
        Type::Slice(_) => "take a `Vec<…>` instead of a `&[…]`".into(),
        _ => "take it by value (its type without `&`), or in an `Arc` to share it".into(),
    }
}

/// Whether a value of this type may borrow, as far as its spelling shows: a reference, or a
/// lifetime other than `'static`. (A generic `T` may borrow too; rustc reports that.)
fn borrows(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => !r.lifetime.as_ref().is_some_and(is_static) || borrows(&r.elem),
        Type::Path(p) => {
            p.qself.as_ref().is_some_and(|q| borrows(&q.ty))
                || p.path
                    .segments
                    .iter()
                    .any(|s| arguments_borrow(&s.arguments))
        }
        Type::Tuple(t) => t.elems.iter().any(borrows),
        Type::Array(a) => borrows(&a.elem),
        Type::Slice(s) => borrows(&s.elem),
        Type::Paren(p) => borrows(&p.elem),
        Type::Group(g) => borrows(&g.elem),
        Type::TraitObject(t) => bounds_borrow(t.bounds.iter()),
        Type::ImplTrait(t) => bounds_borrow(t.bounds.iter()),
        // A function pointer's references are its own arguments', not captured borrows.
        _ => false,
    }
}

fn bounds_borrow<'a>(mut bounds: impl Iterator<Item = &'a TypeParamBound>) -> bool {
    bounds.any(|bound| match bound {
        TypeParamBound::Lifetime(l) => !is_static(l),
        TypeParamBound::Trait(t) => t
            .path
            .segments
            .iter()
            .any(|s| arguments_borrow(&s.arguments)),
        _ => false,
    })
}

/// Whether generic arguments such as `<'a, T>` borrow. `Fn(&str)` does not: its references are
/// the closure's arguments.
fn arguments_borrow(arguments: &PathArguments) -> bool {
    let PathArguments::AngleBracketed(args) = arguments else {
        return false;
    };
    args.args.iter().any(|arg| match arg {
        GenericArgument::Lifetime(l) => !is_static(l),
        GenericArgument::Type(t) => borrows(t),
        GenericArgument::AssocType(a) => borrows(&a.ty),
        _ => false,
    })
}

fn is_static(lifetime: &Lifetime) -> bool {
    lifetime.ident == "static"
}

/// Whether `tokens` use the variable `name`: as an identifier that is not a field or method
/// (`x.name`), a path segment (`a::name`) or a name being declared (`name: T`), or inside a
/// string literal as a format argument (`"{name}"`, `"{name:?}"`).
fn mentions(tokens: &TokenStream, name: &str) -> bool {
    let tokens: Vec<TokenTree> = tokens.clone().into_iter().collect();
    let punct = |i: Option<usize>, c: char, spacing: Spacing| {
        matches!(i.and_then(|i| tokens.get(i)),
            Some(TokenTree::Punct(p)) if p.as_char() == c && p.spacing() == spacing)
    };
    tokens.iter().enumerate().any(|(i, token)| match token {
        TokenTree::Ident(ident) => {
            // `x.name`, but not the range `0..name`.
            let field = punct(i.checked_sub(1), '.', Spacing::Alone)
                && !punct(i.checked_sub(2), '.', Spacing::Joint);
            let path_segment = punct(i.checked_sub(1), ':', Spacing::Alone)
                && punct(i.checked_sub(2), ':', Spacing::Joint);
            let declared = punct(Some(i + 1), ':', Spacing::Alone);
            ident.unraw() == name && !field && !path_segment && !declared
        }
        TokenTree::Group(group) => mentions(&group.stream(), name),
        TokenTree::Literal(literal) => {
            let text = literal.to_string();
            text.contains(&format!("{{{name}}}")) || text.contains(&format!("{{{name}:"))
        }
        TokenTree::Punct(_) => false,
    })
}

#[cfg(test)]
mod tests {
    use proc_macro2::Span;
    use quote::{quote, ToTokens};
    use syn::parse_quote;

    use super::*;

    #[test]
    fn mentions_skips_fields_paths_and_declarations() {
        let body = quote! {
            let n = p.id + Self::id + x::id;
            let s = S { id: 1, key: p };
            let id: u32 = 2;
        };
        assert!(!mentions(&body, "id"));
        assert!(mentions(&quote!(f(id)), "id"));
        assert!(mentions(&quote!(S { id }), "id"));
        assert!(mentions(&quote!(S { key: id }), "id"));
        assert!(mentions(&quote!(id.len()), "id"));
        assert!(mentions(&quote!(0..id), "id"));
        assert!(mentions(&quote!(id::<u8>()), "id"));
        assert!(mentions(&quote!(format!("order {id}")), "id"));
        assert!(mentions(&quote!(format!("order {id:?}")), "id"));
        assert!(!mentions(&quote!(format!("order {idx}")), "id"));
        assert!(mentions(&quote!(self.runs), "self"));
    }

    #[test]
    fn borrowing_types() {
        let borrowing: [Type; 6] = [
            parse_quote!(&str),
            parse_quote!(&'a mut Vec<u8>),
            parse_quote!(Cow<'a, str>),
            parse_quote!((u8, &'static &'a str)),
            parse_quote!(Box<dyn Trait + 'a>),
            parse_quote!(Option<Wrapper<'_>>),
        ];
        for ty in borrowing {
            assert!(borrows(&ty), "{}", ty.to_token_stream());
        }
        let owned: [Type; 5] = [
            parse_quote!(String),
            parse_quote!(&'static str),
            parse_quote!(Cow<'static, str>),
            parse_quote!(Box<dyn Fn(&str) -> u8 + Send>),
            parse_quote!(fn(&str) -> u8),
        ];
        for ty in owned {
            assert!(!borrows(&ty), "{}", ty.to_token_stream());
        }
    }

    #[test]
    fn hashed_leaves_out_what_the_arguments_name() {
        let sig: Signature = parse_quote! {
            async fn f(
                &self,
                state: &State,
                tx: &mut Tx,
                tenant: &str,
                req: Request,
                id: &str,
                (a, mut b): (u8, u8),
                _: u8,
            ) -> Result<(), E>
        };
        let (engine, key, caller, tx): (Expr, Expr, Expr, Ident) = (
            parse_quote!(state.idem()),
            parse_quote!(&*id),
            parse_quote!(tenant),
            parse_quote!(tx),
        );
        let not_hashed = NotHashed {
            engine: Some(&engine),
            key: Some(&key),
            caller: Some(&caller),
            transaction: Some(&tx),
            skip: &[],
        };
        assert_eq!(names(&sig, &not_hashed), ["req", "a", "b"]);

        // A key taken from a field leaves the rest of the request hashed.
        let key: Expr = parse_quote!(req.id);
        let not_hashed = NotHashed {
            key: Some(&key),
            ..not_hashed
        };
        assert_eq!(names(&sig, &not_hashed), ["req", "id", "a", "b"]);

        // `skip` leaves out what it names, a name bound by a pattern too.
        let skip: [Ident; 2] = [parse_quote!(req), parse_quote!(b)];
        let not_hashed = NotHashed {
            skip: &skip,
            ..not_hashed
        };
        assert_eq!(names(&sig, &not_hashed), ["id", "a"]);
    }

    fn names(sig: &Signature, not_hashed: &NotHashed<'_>) -> Vec<String> {
        match hashed(sig, not_hashed) {
            Ok(names) => names.iter().map(ToString::to_string).collect(),
            Err(e) => panic!("{e}"),
        }
    }

    /// The variables a key expression is built from whole, as names.
    fn sources(key: Expr) -> Vec<String> {
        let mut names = Vec::new();
        built_from(&key, &mut names);
        names.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_key_is_built_from_a_variable_only_when_it_holds_all_of_it() {
        let whole: [(Expr, &[&str]); 10] = [
            (parse_quote!(id), &["id"]),
            (parse_quote!(&*id), &["id"]),
            (parse_quote!(id.as_ref()), &["id"]),
            (parse_quote!(id.as_str().to_owned()), &["id"]),
            (parse_quote!(n.to_string()), &["n"]),
            (parse_quote!(format!("{}-{}", a, b)), &["a", "b"]),
            (parse_quote!(format!("{a}-{b:>4}-{{c}}")), &["a", "b"]),
            (
                parse_quote!(&format!("{x}/{}", b.as_str(), x = a)),
                &["b", "a"],
            ),
            (parse_quote!(std::format!("{0}{0}", a)), &["a"]),
            (parse_quote!(format!("{}", format!("{a}"))), &["a"]),
        ];
        for (key, names) in whole {
            assert_eq!(sources(key.clone()), names, "{}", key.to_token_stream());
        }
        let partial: [Expr; 8] = [
            parse_quote!(req.id),
            parse_quote!(req.id()),
            parse_quote!(id.trim()),
            parse_quote!(ids[0]),
            parse_quote!(lookup(id)),
            parse_quote!(format!("{}", req.id)),
            parse_quote!(concat_ids!(a, b)),
            parse_quote!(format!("{:w$}", req.id, w = width)),
        ];
        for key in partial {
            assert_eq!(
                sources(key.clone()),
                Vec::<String>::new(),
                "{}",
                key.to_token_stream()
            );
        }
    }

    #[test]
    fn skip_refuses_what_it_cannot_leave_out() {
        let sig: Signature = parse_quote! {
            async fn f(&self, state: &State, id: &str, cents: u64) -> Result<(), E>
        };
        let (engine, key): (Expr, Expr) = (parse_quote!(state.idem), parse_quote!(id.as_ref()));
        let refused = |skip: Ident| {
            let skip = [skip];
            let not_hashed = NotHashed {
                engine: Some(&engine),
                key: Some(&key),
                caller: None,
                transaction: None,
                skip: &skip,
            };
            match hashed(&sig, &not_hashed) {
                Ok(names) => panic!("accepted, hashing {names:?}"),
                Err(e) => e.to_string(),
            }
        };
        assert_eq!(
            refused(parse_quote!(amount)),
            "`skip` names `amount`, which is not an argument of `f`; its arguments are `state`, \
             `id`, `cents`"
        );
        assert!(refused(Ident::new("self", Span::call_site())).starts_with("`self` is never part"));
        assert!(refused(parse_quote!(state)).contains("as the engine is taken from it"));
        assert!(refused(parse_quote!(id)).contains("as the key is built from it"));
    }
}
