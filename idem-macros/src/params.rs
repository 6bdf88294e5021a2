//! What the function's parameters mean to the attribute: which of them the default fingerprint
//! hashes.

use syn::ext::IdentExt;
use syn::{Expr, FnArg, Ident, Pat, Signature, UnOp};

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

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    use super::*;

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
