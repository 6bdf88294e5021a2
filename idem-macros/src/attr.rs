//! Parsing and validation of the arguments of `#[idempotent(…)]`.
//!
//! Every argument keeps its keyword token next to its value, so an error about the argument
//! (given twice, missing a value) points at the keyword the user wrote.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{discouraged::Speculative, Parse, ParseStream};
use syn::{Expr, Ident, LitBool, LitStr, Token};

use crate::duration::DurationLit;

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(scope);
    syn::custom_keyword!(store);
    syn::custom_keyword!(caller);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(on_locked);
    syn::custom_keyword!(transaction);
    syn::custom_keyword!(detach);
}

const KNOWN: &str = "`key`, `scope`, `store`, `caller`, `fingerprint`, `lease`, `ttl`, \
                     `on_locked`, `transaction`, `detach`";

/// The longest scope, in bytes (as for every key part).
const MAX_SCOPE_LEN: usize = 255;

/// The arguments as written, each with its keyword.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<(kw::key, Expr)>,
    pub(crate) scope: Option<(kw::scope, LitStr)>,
    pub(crate) store: Option<(kw::store, Expr)>,
    pub(crate) caller: Option<(kw::caller, Expr)>,
    pub(crate) fingerprint: Option<(kw::fingerprint, Expr)>,
    pub(crate) lease: Option<(kw::lease, DurationLit)>,
    pub(crate) ttl: Option<(kw::ttl, DurationLit)>,
    pub(crate) on_locked: Option<(kw::on_locked, Expr)>,
    pub(crate) transaction: Option<(kw::transaction, Ident)>,
    pub(crate) detach: Option<(kw::detach, LitBool)>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Args> {
        let mut args = Args::default();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::key) {
                assign(input, &mut args.key, "key", parse_expr)?;
            } else if lookahead.peek(kw::scope) {
                assign(input, &mut args.scope, "scope", parse_scope)?;
            } else if lookahead.peek(kw::store) {
                assign(input, &mut args.store, "store", parse_expr)?;
            } else if lookahead.peek(kw::caller) {
                assign(input, &mut args.caller, "caller", parse_expr)?;
            } else if lookahead.peek(kw::fingerprint) {
                assign(input, &mut args.fingerprint, "fingerprint", parse_expr)?;
            } else if lookahead.peek(kw::lease) {
                assign(input, &mut args.lease, "lease", parse_duration("lease"))?;
            } else if lookahead.peek(kw::ttl) {
                assign(input, &mut args.ttl, "ttl", parse_duration("ttl"))?;
            } else if lookahead.peek(kw::on_locked) {
                assign(input, &mut args.on_locked, "on_locked", parse_expr)?;
            } else if lookahead.peek(kw::transaction) {
                assign(input, &mut args.transaction, "transaction", parse_parameter)?;
            } else if lookahead.peek(kw::detach) {
                assign(input, &mut args.detach, "detach", parse_bool)?;
            } else if input.peek(Ident::peek_any) {
                let unknown = input.call(Ident::parse_any)?;
                return Err(syn::Error::new(
                    unknown.span(),
                    format!(
                        "unknown argument `{unknown}` of `#[idempotent]`; the arguments are {KNOWN}"
                    ),
                ));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// Parses `<keyword> = <value>` into `slot`, refusing a second occurrence of the keyword.
fn assign<K, V>(
    input: ParseStream<'_>,
    slot: &mut Option<(K, V)>,
    name: &str,
    value: impl FnOnce(ParseStream<'_>) -> syn::Result<V>,
) -> syn::Result<()>
where
    K: Parse + ToTokens,
{
    let keyword: K = input.parse()?;
    if slot.is_some() {
        return Err(syn::Error::new_spanned(
            keyword,
            format!("`{name}` given twice: keep one `{name} = …`"),
        ));
    }
    if !input.peek(Token![=]) {
        return Err(syn::Error::new_spanned(
            keyword,
            format!("`{name}` needs a value: write `{name} = …`"),
        ));
    }
    input.parse::<Token![=]>()?;
    let value = value(input)?;
    *slot = Some((keyword, value));
    Ok(())
}

fn parse_expr(input: ParseStream<'_>) -> syn::Result<Expr> {
    input.parse()
}

/// The name of a parameter (`transaction = tx`), or an error spanned on whatever expression
/// stands in its place.
fn parse_parameter(input: ParseStream<'_>) -> syn::Result<Ident> {
    let fork = input.fork();
    if let Ok(ident) = fork.parse::<Ident>() {
        if fork.is_empty() || fork.peek(Token![,]) {
            input.advance_to(&fork);
            return Ok(ident);
        }
    }
    let expr: Expr = input.parse()?;
    Err(syn::Error::new_spanned(
        expr,
        "`transaction` takes the name of a parameter of this function, such as \
         `transaction = tx` for `tx: &mut sqlx::Transaction<'_, Sqlite>`",
    ))
}

/// `true` or `false`, or an error spanned on whatever expression stands in its place.
fn parse_bool(input: ParseStream<'_>) -> syn::Result<LitBool> {
    if input.peek(LitBool) {
        return input.parse();
    }
    let expr: Expr = input.parse()?;
    Err(syn::Error::new_spanned(
        expr,
        "`detach` takes `true` or `false`, such as `detach = true`",
    ))
}

/// A string literal, or an error spanned on whatever expression stands in its place.
fn parse_lit_str(input: ParseStream<'_>, expected: &str) -> syn::Result<LitStr> {
    if input.peek(LitStr) {
        return input.parse();
    }
    let expr: Expr = input.parse()?;
    Err(syn::Error::new_spanned(expr, expected))
}

fn parse_scope(input: ParseStream<'_>) -> syn::Result<LitStr> {
    let lit = parse_lit_str(
        input,
        "`scope` takes a string literal, such as `scope = \"deposit\"`, so it is checked at \
         compile time",
    )?;
    if let Err(msg) = check_scope(&lit.value()) {
        return Err(syn::Error::new(lit.span(), msg));
    }
    Ok(lit)
}

fn parse_duration(name: &'static str) -> impl FnOnce(ParseStream<'_>) -> syn::Result<DurationLit> {
    move |input| {
        let lit = parse_lit_str(
            input,
            &format!(
                "`{name}` takes a string literal with a unit, such as `{name} = \"30s\"` or \
                 `{name} = \"1h30m\"`"
            ),
        )?;
        DurationLit::parse(lit)
    }
}

/// Checks a scope as the runtime checks every key part: 1..=255 bytes of printable ASCII.
pub(crate) fn check_scope(scope: &str) -> Result<(), String> {
    if scope.is_empty() {
        return Err("the scope is empty: name the operation, such as \"deposit\"".into());
    }
    if scope.len() > MAX_SCOPE_LEN {
        return Err(format!(
            "the scope is {} bytes long; at most {MAX_SCOPE_LEN} bytes are allowed",
            scope.len()
        ));
    }
    if let Some((offset, c)) = scope.char_indices().find(|(_, c)| !(' '..='~').contains(c)) {
        return Err(format!(
            "the scope holds {c:?} at byte {offset}; only printable ASCII (space to `~`) is \
             allowed"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_scope;

    #[test]
    fn scopes_are_printable_ascii_of_1_to_255_bytes() {
        assert!(check_scope("deposit").is_ok());
        assert!(check_scope("a b:c/~").is_ok());
        assert!(check_scope(&"x".repeat(255)).is_ok());
        assert!(check_scope("").is_err());
        assert!(check_scope(&"x".repeat(256)).is_err());
        assert!(check_scope("tab\there").is_err());
        assert!(check_scope("dépôt").is_err());
    }
}
