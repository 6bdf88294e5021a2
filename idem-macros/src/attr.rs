//! Parsing and validation of the arguments of `#[idempotent(…)]`.
//!
//! Every argument keeps its keyword token next to its value, so an error about the argument
//! (given twice, missing a value) points at the keyword the user wrote.

use syn::ext::IdentExt;
use syn::parse::{discouraged::Speculative, Parse, ParseStream};
use syn::{parenthesized, token, Expr, Ident, LitBool, LitInt, LitStr, Token};

use crate::duration::DurationLit;

/// The arguments, in the order the docs list them.
const NAMES: [&str; 14] = [
    "key",
    "scope",
    "engine",
    "caller",
    "fingerprint",
    "skip",
    "lease",
    "retention",
    "on_locked",
    "on_lapse",
    "policy",
    "transaction",
    "detach",
    "steps",
];

/// Old spellings that still work, with a deprecation warning: `(old, new)`.
const ALIASES: [(&str, &str); 2] = [("store", "engine"), ("ttl", "retention")];

/// The longest scope, in bytes (as for every key part).
const MAX_SCOPE_LEN: usize = 255;

/// An argument as written: the keyword (kept for spans) and its value.
pub(crate) type Arg<V> = Option<(Ident, V)>;

/// The arguments as written, each with its keyword.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Arg<Expr>,
    pub(crate) scope: Arg<LitStr>,
    pub(crate) engine: Arg<Expr>,
    pub(crate) caller: Arg<Expr>,
    pub(crate) fingerprint: Arg<Expr>,
    /// The arguments `skip(…)` leaves out of the default fingerprint, each name once.
    pub(crate) skip: Arg<Vec<Ident>>,
    pub(crate) lease: Arg<DurationLit>,
    pub(crate) retention: Arg<DurationLit>,
    pub(crate) on_locked: Arg<Expr>,
    /// `uncertain` or `release`.
    pub(crate) on_lapse: Arg<Ident>,
    /// The fingerprint's policy version, as written.
    pub(crate) policy: Arg<u32>,
    pub(crate) transaction: Arg<Ident>,
    pub(crate) detach: Arg<LitBool>,
    /// The name the body's [`Steps`] handle is bound to.
    pub(crate) steps: Arg<Ident>,
    /// Old spellings used (`store`, `ttl`), each with the name that replaces it.
    pub(crate) deprecated: Vec<(Ident, &'static str)>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Args> {
        let mut args = Args::default();
        while !input.is_empty() {
            if !input.peek(Ident::peek_any) {
                return Err(input.error(format!(
                    "expected an argument of `#[idempotent]`, such as `key = …`; the arguments \
                     are {}",
                    list(&NAMES)
                )));
            }
            let keyword = input.call(Ident::parse_any)?;
            let written = keyword.unraw().to_string();
            let name = match ALIASES.iter().find(|(old, _)| *old == written) {
                Some((_, new)) => {
                    args.deprecated.push((keyword.clone(), new));
                    *new
                }
                None => written.as_str(),
            };
            match name {
                "key" => assign(input, &mut args.key, keyword, parse_expr)?,
                "scope" => assign(input, &mut args.scope, keyword, parse_scope)?,
                "engine" => assign(input, &mut args.engine, keyword, parse_expr)?,
                "caller" => assign(input, &mut args.caller, keyword, parse_expr)?,
                "fingerprint" => assign(input, &mut args.fingerprint, keyword, parse_expr)?,
                "skip" => parse_skip(input, &mut args.skip, keyword)?,
                "lease" => assign(input, &mut args.lease, keyword, parse_duration)?,
                "retention" => assign(input, &mut args.retention, keyword, parse_duration)?,
                "on_locked" => assign(input, &mut args.on_locked, keyword, parse_expr)?,
                "on_lapse" => assign(input, &mut args.on_lapse, keyword, parse_on_lapse)?,
                "policy" => assign(input, &mut args.policy, keyword, parse_policy)?,
                "transaction" => assign(input, &mut args.transaction, keyword, parse_parameter)?,
                "detach" => assign(input, &mut args.detach, keyword, parse_bool)?,
                "steps" => assign(input, &mut args.steps, keyword, parse_binding)?,
                _ => return Err(unknown(&keyword)),
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// The error for an argument that does not exist, with the closest known name when one is near.
fn unknown(keyword: &Ident) -> syn::Error {
    let written = keyword.unraw().to_string();
    let closest = NAMES
        .iter()
        .chain(ALIASES.iter().map(|(old, _)| old))
        .map(|name| (edit_distance(&written, name), *name))
        .min()
        .filter(|(distance, _)| *distance <= written.chars().count().div_ceil(3))
        .map(|(_, name)| new_name(name));
    let message = match closest {
        Some(name) => {
            format!("unknown argument `{written}` of `#[idempotent]`: did you mean `{name}`?")
        }
        None => format!(
            "unknown argument `{written}` of `#[idempotent]`; the arguments are {}",
            list(&NAMES)
        ),
    };
    syn::Error::new(keyword.span(), message)
}

/// The current name of an argument written under its old name, or the name itself.
fn new_name(name: &str) -> &str {
    ALIASES
        .iter()
        .find(|(old, _)| *old == name)
        .map_or(name, |(_, new)| new)
}

fn list(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Levenshtein distance between `a` and `b`, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Parses `= <value>` after `keyword` into `slot`, refusing a second occurrence of the argument
/// (under either of its names).
fn assign<V>(
    input: ParseStream<'_>,
    slot: &mut Arg<V>,
    keyword: Ident,
    value: impl FnOnce(ParseStream<'_>, &str) -> syn::Result<V>,
) -> syn::Result<()> {
    let written = keyword.unraw().to_string();
    let name = new_name(&written);
    if let Some((first, _)) = slot {
        let message = if *first == keyword {
            format!("`{name}` given twice: keep one `{name} = …`")
        } else {
            format!("`{name}` given twice, as `{first}` and as `{keyword}`: keep one `{name} = …`")
        };
        return Err(syn::Error::new(keyword.span(), message));
    }
    if !input.peek(Token![=]) {
        return Err(syn::Error::new(
            keyword.span(),
            format!("`{written}` needs a value: write `{name} = …`"),
        ));
    }
    input.parse::<Token![=]>()?;
    let value = value(input, name)?;
    *slot = Some((keyword, value));
    Ok(())
}

/// Parses `(a, b)` after `skip` into `slot`, refusing a second `skip` and a name given twice.
fn parse_skip(
    input: ParseStream<'_>,
    slot: &mut Arg<Vec<Ident>>,
    keyword: Ident,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            keyword.span(),
            "`skip` given twice: name every argument to leave out in one `skip(…)`",
        ));
    }
    if !input.peek(token::Paren) {
        return Err(syn::Error::new(
            keyword.span(),
            "`skip` takes the names of arguments in parentheses, such as `skip(client, counter)`",
        ));
    }
    let content;
    parenthesized!(content in input);
    let mut names: Vec<Ident> = Vec::new();
    while !content.is_empty() {
        let name = parse_argument_name(&content)?;
        if names.iter().any(|seen| seen.unraw() == name.unraw()) {
            return Err(syn::Error::new(
                name.span(),
                format!(
                    "`{}` is named twice in `skip(…)`: name it once",
                    name.unraw()
                ),
            ));
        }
        names.push(name);
        if content.is_empty() {
            break;
        }
        content.parse::<Token![,]>()?;
    }
    if names.is_empty() {
        return Err(syn::Error::new(
            keyword.span(),
            "`skip()` names no argument: name the arguments to leave out of the default \
             fingerprint, such as `skip(client, counter)`, or remove it",
        ));
    }
    *slot = Some((keyword, names));
    Ok(())
}

/// One name in `skip(…)`, `self` included (refused later, with the reason), or an error spanned
/// on whatever expression stands in its place.
fn parse_argument_name(input: ParseStream<'_>) -> syn::Result<Ident> {
    let fork = input.fork();
    if let Ok(ident) = fork.call(Ident::parse_any) {
        if fork.is_empty() || fork.peek(Token![,]) {
            input.advance_to(&fork);
            return Ok(ident);
        }
    }
    let expr: Expr = input.parse()?;
    Err(syn::Error::new_spanned(
        expr,
        "`skip` takes the names of the function's arguments, such as `skip(client)`, not an \
         expression: to hash part of an argument, write `fingerprint = …`",
    ))
}

fn parse_expr(input: ParseStream<'_>, _name: &str) -> syn::Result<Expr> {
    input.parse()
}

/// The name of a parameter (`transaction = tx`), or an error spanned on whatever expression
/// stands in its place.
fn parse_parameter(input: ParseStream<'_>, _name: &str) -> syn::Result<Ident> {
    parse_name(
        input,
        "`transaction` takes the name of a parameter of this function, such as \
         `transaction = tx` for `tx: &mut sqlx::Transaction<'_, Sqlite>`",
    )
}

/// The name the body's steps handle is bound to (`steps = steps`), or an error spanned on
/// whatever stands in its place.
fn parse_binding(input: ParseStream<'_>, _name: &str) -> syn::Result<Ident> {
    parse_name(
        input,
        "`steps` takes a name for the body's `idem::Steps` handle, such as `steps = steps`",
    )
}

/// What the key becomes if the call's claim lapses: `uncertain` or `release`, or an error
/// spanned on whatever stands in its place.
fn parse_on_lapse(input: ParseStream<'_>, _name: &str) -> syn::Result<Ident> {
    let refusal = "`on_lapse` takes `uncertain` (the call's effect must not repeat: a claim that \
                   lapses leaves the key uncertain until it is resolved) or `release` (the \
                   default: a retry runs again), such as `on_lapse = uncertain`";
    let ident = parse_name(input, refusal)?;
    match ident.to_string().as_str() {
        "uncertain" | "release" => Ok(ident),
        _ => Err(syn::Error::new(ident.span(), refusal)),
    }
}

/// The fingerprint's policy version: an integer literal that fits a `u32`.
fn parse_policy(input: ParseStream<'_>, _name: &str) -> syn::Result<u32> {
    let refusal = "`policy` takes the version of what the fingerprint hashes, a whole number \
                   from 0 to 4294967295, such as `policy = 2`";
    if input.peek(LitInt) {
        let lit: LitInt = input.parse()?;
        return lit
            .base10_parse::<u32>()
            .map_err(|_| syn::Error::new(lit.span(), refusal));
    }
    let expr: Expr = input.parse()?;
    Err(syn::Error::new_spanned(expr, refusal))
}

/// A bare name, or `refusal` spanned on the expression written instead.
fn parse_name(input: ParseStream<'_>, refusal: &str) -> syn::Result<Ident> {
    let fork = input.fork();
    if let Ok(ident) = fork.parse::<Ident>() {
        if fork.is_empty() || fork.peek(Token![,]) {
            input.advance_to(&fork);
            return Ok(ident);
        }
    }
    let expr: Expr = input.parse()?;
    Err(syn::Error::new_spanned(expr, refusal))
}

fn parse_bool(input: ParseStream<'_>, _name: &str) -> syn::Result<LitBool> {
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

fn parse_scope(input: ParseStream<'_>, _name: &str) -> syn::Result<LitStr> {
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

fn parse_duration(input: ParseStream<'_>, name: &str) -> syn::Result<DurationLit> {
    let lit = parse_lit_str(
        input,
        &format!(
            "`{name}` takes a string literal with a unit, such as `{name} = \"30s\"` or \
             `{name} = \"1h30m\"`"
        ),
    )?;
    DurationLit::parse(lit)
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
    use super::{check_scope, edit_distance};

    #[test]
    fn edit_distance_counts_characters() {
        assert_eq!(edit_distance("retension", "retention"), 1);
        assert_eq!(edit_distance("engnie", "engine"), 2);
        assert_eq!(edit_distance("", "key"), 3);
        assert_eq!(edit_distance("key", "key"), 0);
        assert_eq!(edit_distance("clé", "cle"), 1);
    }

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
