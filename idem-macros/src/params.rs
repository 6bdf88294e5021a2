//! What the function's parameters mean to the attribute: which of them the default fingerprint
//! hashes, and which a detached body would borrow.

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::{
    Expr, FnArg, GenericArgument, Ident, Lifetime, Pat, PathArguments, Signature, Type,
    TypeParamBound, UnOp,
};

/// What the attribute's arguments name, which the default fingerprint leaves out.
pub(crate) struct NotHashed<'a> {
    pub(crate) engine: Option<&'a Expr>,
    pub(crate) key: Option<&'a Expr>,
    pub(crate) caller: Option<&'a Expr>,
    pub(crate) transaction: Option<&'a Ident>,
}

/// The names bound by the parameters, in order, that the default fingerprint hashes: all but
/// the receiver, the one `engine` is taken from (`state` in `engine = state.idem`), the one
/// `key` or `caller` is (`id` in `key = id` or `key = &id`, not `req` in `key = req.id`: the
/// rest of `req` is the request), and the `transaction` parameter.
pub(crate) fn hashed(sig: &Signature, not_hashed: &NotHashed<'_>) -> Vec<Ident> {
    let left_out: Vec<&Ident> = [
        not_hashed.engine.and_then(root),
        not_hashed.key.and_then(whole),
        not_hashed.caller.and_then(whole),
        not_hashed.transaction,
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut names = Vec::new();
    for input in &sig.inputs {
        if let FnArg::Typed(typed) = input {
            bindings(&typed.pat, &mut names);
        }
    }
    names.retain(|name| !left_out.iter().any(|out| out.unraw() == name.unraw()));
    names
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
        };
        let names: Vec<String> = hashed(&sig, &not_hashed)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["req", "a", "b"]);

        // A key taken from a field leaves the rest of the request hashed.
        let key: Expr = parse_quote!(req.id);
        let not_hashed = NotHashed {
            key: Some(&key),
            ..not_hashed
        };
        let names: Vec<String> = hashed(&sig, &not_hashed)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["req", "id", "a", "b"]);
    }
}
