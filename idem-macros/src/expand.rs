//! Checks the annotated function and rewrites its body into a call of
//! `::idem::__private::run`, or, with `transaction = …`, into `tx_begin`, the body and `tx_end`
//! on the caller's connection.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{AttrStyle, Expr, FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Type};

use crate::attr::{check_scope, Args};
use crate::duration::DurationLit;

/// The whole attribute: on any error, the original function is emitted unchanged next to the
/// error, so the rest of the crate still type-checks and only the real mistake is reported.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(e) => {
            let error = syn::Error::new(
                e.span(),
                format!(
                    "`#[idempotent]` goes on an `async fn` with a body (a free function or a \
                     method in an `impl` block): {e}"
                ),
            );
            return with_error(item, error);
        }
    };
    let args: Args = match syn::parse2(args) {
        Ok(args) => args,
        Err(e) => return with_error(item, e),
    };
    match check(&func, args) {
        Ok(call) => expand(func, call),
        Err(e) => with_error(item, e),
    }
}

fn with_error(mut item: TokenStream, error: syn::Error) -> TokenStream {
    item.extend(error.into_compile_error());
    item
}

/// Everything the expansion needs, checked.
struct Call {
    return_type: Type,
    scope: LitStr,
    key: Expr,
    store: Expr,
    caller: Option<Expr>,
    fingerprint: Option<Expr>,
    lease: Option<DurationLit>,
    ttl: Option<DurationLit>,
    on_locked: Option<Expr>,
    /// The parameter holding the caller's connection or transaction: transactional mode.
    transaction: Option<Ident>,
    /// Run the body on a task of its own, so cancelling the caller cannot stop it.
    detach: bool,
}

/// Checks the function and the required arguments, reporting every problem at once.
fn check(func: &ItemFn, args: Args) -> syn::Result<Call> {
    let sig = &func.sig;
    let asyncness = match sig.asyncness {
        Some(_) => Ok(()),
        None => Err(syn::Error::new_spanned(
            sig.fn_token,
            "`#[idempotent]` needs an `async fn`: it waits on the store before and after the \
             body; add `async` before `fn`",
        )),
    };
    let return_type = match &sig.output {
        ReturnType::Type(_, ty) if is_result(ty) => Ok((**ty).clone()),
        ReturnType::Type(_, ty) => Err(syn::Error::new_spanned(
            ty,
            "`#[idempotent]` needs a return type `Result<T, E>` (T: Serialize + \
             DeserializeOwned, E: From<idem::Error>): idem's own errors reach the caller \
             through `E`, and only `Ok` values are stored",
        )),
        ReturnType::Default => Err(syn::Error::new_spanned(
            sig,
            "`#[idempotent]` needs a return type `Result<T, E>` (T: Serialize + \
             DeserializeOwned, E: From<idem::Error>); this function returns `()`",
        )),
    };
    let scope = match &args.scope {
        Some((_, lit)) => Ok(lit.clone()),
        None => default_scope(func),
    };
    let transactional = match &args.transaction {
        Some((_, parameter)) => check_transaction(func, parameter, &args),
        None => Ok(()),
    };
    let detach = match (&args.detach, &args.transaction) {
        (Some((keyword, value)), Some(_)) if value.value => Err(syn::Error::new_spanned(
            keyword,
            "`detach` does not apply with `transaction`: the body runs on your transaction, \
             which cannot outlive this call; a cancelled call rolls back with it; remove `detach`",
        )),
        (Some((_, value)), _) => Ok(value.value),
        (None, _) => Ok(false),
    };
    let key = args.key.map(|(_, key)| key).ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `key = …`: the expression naming this call's request, such as \
             `key = req.request_id` (an `Option` makes idempotency optional)",
        )
    });
    let store = args.store.map(|(_, store)| store).ok_or_else(|| {
        let message = if args.transaction.is_some() {
            "missing `store = …`: the `idem::Transactional` engine to record calls in, such as \
             `store = self.idem` (an engine, a reference to one, or an `Arc` of one)"
        } else {
            "missing `store = …`: the `idem::Idempotency` engine to record calls in, such as \
             `store = self.idem` (an engine, a reference to one, or an `Arc` of one)"
        };
        syn::Error::new(Span::call_site(), message)
    });
    combine_errors(
        [
            asyncness.err(),
            return_type.as_ref().err().cloned(),
            scope.as_ref().err().cloned(),
            key.as_ref().err().cloned(),
            store.as_ref().err().cloned(),
            transactional.err(),
            detach.as_ref().err().cloned(),
        ]
        .into_iter()
        .flatten(),
    )?;
    Ok(Call {
        return_type: return_type?,
        scope: scope?,
        key: key?,
        store: store?,
        caller: args.caller.map(|(_, caller)| caller),
        fingerprint: args.fingerprint.map(|(_, fp)| fp),
        lease: args.lease.map(|(_, lease)| lease),
        ttl: args.ttl.map(|(_, ttl)| ttl),
        on_locked: args.on_locked.map(|(_, on_locked)| on_locked),
        transaction: args.transaction.map(|(_, parameter)| parameter),
        detach: detach?,
    })
}

/// With `transaction = <parameter>`: the parameter exists, and no argument that only the
/// ordinary mode understands is given.
fn check_transaction(func: &ItemFn, parameter: &Ident, args: &Args) -> syn::Result<()> {
    let named = func.sig.inputs.iter().any(|input| match input {
        FnArg::Typed(typed) => {
            matches!(&*typed.pat, Pat::Ident(p) if p.ident.unraw() == parameter.unraw())
        }
        FnArg::Receiver(_) => false,
    });
    let missing = (!named).then(|| {
        syn::Error::new(
            parameter.span(),
            format!(
                "`transaction = {parameter}` names no parameter of `{}`: name the parameter \
                 holding your connection or transaction, such as `tx` in \
                 `tx: &mut sqlx::Transaction<'_, Sqlite>`",
                func.sig.ident.unraw()
            ),
        )
    });
    let lease = args.lease.as_ref().map(|(keyword, _)| {
        syn::Error::new_spanned(
            keyword,
            "`lease` does not apply with `transaction`: the claim stays invisible to other \
             calls until your transaction commits, and it is finished or released inside it; \
             remove `lease`",
        )
    });
    let on_locked = args.on_locked.as_ref().map(|(keyword, _)| {
        syn::Error::new_spanned(
            keyword,
            "`on_locked` does not apply with `transaction`: a concurrent call with the same key \
             waits on the database's lock until your transaction ends, then replays its result; \
             remove `on_locked`",
        )
    });
    combine_errors([missing, lease, on_locked].into_iter().flatten())
}

/// One error holding every error of `errors`, or `Ok` when there is none.
fn combine_errors(errors: impl IntoIterator<Item = syn::Error>) -> syn::Result<()> {
    let mut errors = errors.into_iter();
    match errors.next() {
        None => Ok(()),
        Some(mut all) => {
            all.extend(errors);
            Err(all)
        }
    }
}

/// Whether `ty` names a `Result`: `Result<…>`, `std::result::Result<…>`, `io::Result<…>` or any
/// other alias whose last path segment is `Result`.
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "Result"),
        Type::Group(group) => is_result(&group.elem),
        Type::Paren(paren) => is_result(&paren.elem),
        _ => false,
    }
}

/// Without `scope = …`, the scope is the function's name.
fn default_scope(func: &ItemFn) -> syn::Result<LitStr> {
    let ident = &func.sig.ident;
    let name = ident.unraw().to_string();
    check_scope(&name).map_err(|msg| {
        syn::Error::new(
            ident.span(),
            format!(
                "without `scope = …` the scope is the function name `{name}`, and {msg}: add \
                 `scope = \"…\"`"
            ),
        )
    })?;
    Ok(LitStr::new(&name, ident.span()))
}

fn expand(func: ItemFn, call: Call) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let (inner_attrs, outer_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Inner(_)));
    let Call {
        return_type,
        scope,
        key,
        store,
        caller,
        fingerprint,
        lease,
        ttl,
        on_locked,
        transaction,
        detach,
    } = call;

    // User expressions keep their spans, so a type error points at what the user wrote.
    let engine = match &transaction {
        None => quote_spanned! {store.span()=>
            ::core::clone::Clone::clone(::idem::__private::AsEngine::as_engine(&(#store)))
        },
        Some(_) => quote_spanned! {store.span()=>
            ::core::clone::Clone::clone(::idem::__private::AsTransactional::as_transactional(
                &(#store)
            ))
        },
    };
    let key = quote_spanned! {key.span()=> &(#key)};
    let caller = match caller {
        Some(caller) => quote_spanned! {caller.span()=>
            ::core::option::Option::Some(&(#caller))
        },
        None => quote!(::core::option::Option::None),
    };
    let fingerprint = match fingerprint {
        Some(fp) => quote_spanned! {fp.span()=> ::idem::__private::fingerprint(&(#fp))},
        None => quote!(::core::result::Result::Ok(::core::option::Option::None)),
    };
    let lease = duration(lease);
    let ttl = duration(ttl);
    let on_locked = typed_on_locked(on_locked);

    let run = match detach {
        // The body owns what it uses (`async move`) and must be `'static + Send`.
        true => quote!(::idem::__private::run_detached),
        false => quote!(::idem::__private::run),
    };
    let body = match transaction {
        None => quote! {
            #(#inner_attrs)*
            // Everything the record needs is computed from borrows before the body starts, so
            // the body may still move the function's arguments.
            let __idem_engine = #engine;
            let __idem_key = ::idem::__private::key(#scope, #caller, #key);
            let __idem_fingerprint = #fingerprint;
            let __idem_options = ::idem::__private::options(#lease, #ttl, #on_locked);
            #run(
                &__idem_engine,
                __idem_key,
                __idem_fingerprint,
                __idem_options,
                ::idem::__private::body::<#return_type, _>(async move #block),
            )
            .await
        },
        Some(tx) => {
            // `&mut *tx` reborrows the parameter, so `tx` stays usable, and coerces to the
            // store's connection type from a `&mut` connection or a `&mut Transaction`.
            let conn = quote_spanned! {tx.span()=>
                ::idem::__private::tx_connection(&__idem_engine, &mut *#tx)
            };
            quote! {
                #(#inner_attrs)*
                let __idem_engine = #engine;
                let __idem_key = ::idem::__private::key(#scope, #caller, #key);
                let __idem_fingerprint = #fingerprint;
                let __idem_options = ::idem::__private::options(
                    ::core::option::Option::None,
                    #ttl,
                    ::core::option::Option::None,
                );
                let __idem_claim = match ::idem::__private::tx_begin(
                    &__idem_engine,
                    #conn,
                    __idem_key,
                    __idem_fingerprint,
                    __idem_options,
                )
                .await
                {
                    ::core::result::Result::Ok(::idem::__private::TxBegun::Run(__idem_claim)) => {
                        __idem_claim
                    }
                    ::core::result::Result::Ok(::idem::__private::TxBegun::Replayed(__idem_value)) => {
                        return ::core::result::Result::Ok(__idem_value);
                    }
                    ::core::result::Result::Err(__idem_error) => {
                        return ::core::result::Result::Err(::core::convert::From::from(__idem_error));
                    }
                };
                // Not `move`: the body borrows the connection for as long as it runs, and the
                // claim is finished or released on it afterwards.
                let __idem_result = ::idem::__private::body::<#return_type, _>(async #block).await;
                ::idem::__private::tx_end(&__idem_engine, #conn, __idem_claim, __idem_result).await
            }
        }
    };
    // The new body keeps the original braces' span, so lints about the function (such as
    // `dead_code`) still see it as the user's code.
    let mut body = Group::new(Delimiter::Brace, body);
    body.set_span(block.brace_token.span.join());
    quote! {
        #(#outer_attrs)*
        #vis #sig #body
    }
}

fn duration(d: Option<DurationLit>) -> TokenStream {
    match d {
        Some(DurationLit { lit, millis }) => quote_spanned! {lit.span()=>
            ::core::option::Option::Some(::core::time::Duration::from_millis(#millis))
        },
        None => quote!(::core::option::Option::None),
    }
}

/// The `on_locked` expression, bound to a typed local so a wrong type is reported on it.
fn typed_on_locked(e: Option<Expr>) -> TokenStream {
    match e {
        Some(e) => quote_spanned! {e.span()=>
            {
                let __idem_on_locked: ::idem::OnLocked = #e;
                ::core::option::Option::Some(__idem_on_locked)
            }
        },
        None => quote!(::core::option::Option::None),
    }
}
