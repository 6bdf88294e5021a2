//! Checks the annotated function and rewrites its body into a call of
//! `::idem::__private::call` (or `run_detached`), or, with `transaction = …`, into `tx_begin`, the body and `tx_end`
//! on the caller's connection. A method that `#[async_trait]` has already rewritten (a plain `fn`
//! returning `Pin<Box<dyn Future<Output = R> + …>>`) keeps that form: the boxed body becomes the
//! work of a new boxed future.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{
    AttrStyle, Expr, FnArg, GenericArgument, Ident, ItemFn, LitStr, Pat, PathArguments, ReturnType,
    Type, TypeParamBound,
};

use crate::attr::{check_scope, Args};
use crate::duration::DurationLit;
use crate::params::{self, NotHashed};

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

/// How the function delivers its result.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// `async fn … -> R`.
    Async,
    /// `fn … -> Pin<Box<dyn Future<Output = R> + …>>` with a body that builds the boxed future:
    /// an `async fn` that `#[async_trait]` has rewritten before this attribute sees it.
    Boxed,
}

/// Everything the expansion needs, checked.
struct Call {
    form: Form,
    /// `R`: the `Result<T, E>` (or an alias of one) the function's future resolves to.
    return_type: Type,
    /// `None`: the default scope, the function's path, computed in the expansion.
    scope: Option<LitStr>,
    key: Expr,
    engine: Expr,
    caller: Option<Expr>,
    fingerprint: Fingerprint,
    lease: Option<DurationLit>,
    retention: Option<DurationLit>,
    on_locked: Option<Expr>,
    /// `uncertain` or `release`, as written.
    on_lapse: Option<Ident>,
    /// The fingerprint's policy version: `policy = …`, or derived from what it hashes.
    policy: u32,
    /// The parameter holding the caller's connection or transaction: transactional mode.
    transaction: Option<Ident>,
    /// Run the body on a task of its own, so cancelling the caller cannot stop it.
    detach: bool,
    /// The name of the body's steps handle: the body runs through `Call::run_steps`.
    steps: Option<Ident>,
    /// Old argument names used, each with its new name: each becomes a deprecation warning.
    deprecated: Vec<(Ident, &'static str)>,
}

/// What the call's fingerprint is made of.
enum Fingerprint {
    /// `fingerprint = <expr>`.
    Expr(Expr),
    /// `fingerprint = ()`, or no argument to hash: no fingerprint, so a reused key replays.
    Nothing,
    /// The default: these arguments, by name.
    Arguments(Vec<Ident>),
}

/// Checks the function and the required arguments, reporting every problem at once.
fn check(func: &ItemFn, args: Args) -> syn::Result<Call> {
    let sig = &func.sig;
    let boxed_output = match &sig.output {
        ReturnType::Type(_, ty) => boxed_future_output(ty),
        ReturnType::Default => None,
    };
    let form = match (&sig.asyncness, &sig.output, boxed_output) {
        (Some(_), ReturnType::Type(_, ty), _) => Ok((Form::Async, (**ty).clone())),
        (Some(_), ReturnType::Default, _) => Err(syn::Error::new_spanned(
            sig,
            "`#[idempotent]` needs a return type `Result<T, E>` (T: Serialize + \
             DeserializeOwned, E: From<idem::Error>); this function returns `()`",
        )),
        (None, _, Some(output)) => Ok((Form::Boxed, output.clone())),
        (None, _, None) => Err(syn::Error::new_spanned(
            sig.fn_token,
            "`#[idempotent]` needs an `async fn`: it waits on the store before and after the \
             body; add `async` before `fn`",
        )),
    };
    let scope = match &args.scope {
        Some((_, lit)) => Ok(Some(lit.clone())),
        None => check_default_scope(func).map(|()| None),
    };
    let transactional = match &args.transaction {
        Some((keyword, parameter)) => {
            let boxed = matches!(form, Ok((Form::Boxed, _))).then(|| {
                syn::Error::new(
                    keyword.span(),
                    "`transaction` does not work on a method that `#[async_trait]` has \
                     rewritten: its boxed body owns the connection, so the claim could not be \
                     finished on it afterwards; write the trait with a native `async fn` \
                     (without `#[async_trait]`) to use `transaction`",
                )
            });
            combine_errors(
                boxed
                    .into_iter()
                    .chain(check_transaction(func, parameter, &args).err()),
            )
        }
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
    // Steps run through `Call::run_steps`, which neither detaches nor runs on a transaction
    // (a step's own transaction is `steps.tx`), and need the body as an `async` block.
    let steps = match &args.steps {
        Some((keyword, name)) => {
            let refusal = if args.transaction.is_some() {
                Some("`steps` does not apply with `transaction`: each step may run a transaction of its own with `steps.tx`; remove `transaction`")
            } else if matches!(args.detach, Some((_, ref value)) if value.value) {
                Some("`steps` does not combine with `detach = true` yet: a cancelled call stops at a step, and the retry resumes after the last finished one; remove `detach`")
            } else if matches!(form, Ok((Form::Boxed, _))) {
                Some("`steps` does not work on a method that `#[async_trait]` has rewritten; write the trait with a native `async fn`")
            } else {
                None
            };
            match refusal {
                Some(message) => Err(syn::Error::new_spanned(keyword, message)),
                None => Ok(Some(name.clone())),
            }
        }
        None => Ok(None),
    };
    let borrowed = match detach {
        Ok(true) => params::check_detached(sig, &func.block.to_token_stream()),
        _ => Vec::new(),
    };
    let fingerprint = match (&args.fingerprint, &args.skip) {
        (Some(_), Some((keyword, _))) => Err(syn::Error::new(
            keyword.span(),
            "`skip` only applies to the default fingerprint, which `fingerprint = …` replaces: \
             remove `skip`, and leave those arguments out of the `fingerprint` expression",
        )),
        (Some((_, Expr::Tuple(unit))), None) if unit.elems.is_empty() => Ok(Fingerprint::Nothing),
        (Some((_, fingerprint)), None) => Ok(Fingerprint::Expr(fingerprint.clone())),
        (None, skip) => {
            let not_hashed = NotHashed {
                engine: args.engine.as_ref().map(|(_, engine)| engine),
                key: args.key.as_ref().map(|(_, key)| key),
                caller: args.caller.as_ref().map(|(_, caller)| caller),
                transaction: args.transaction.as_ref().map(|(_, parameter)| parameter),
                skip: skip.as_ref().map_or(&[], |(_, names)| names),
            };
            params::hashed(sig, &not_hashed).map(|names| match names {
                names if names.is_empty() => Fingerprint::Nothing,
                names => Fingerprint::Arguments(names),
            })
        }
    };
    let key = args.key.map(|(_, key)| key).ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `key = …`: the expression naming this call's request, such as \
             `key = req.request_id` (an `Option` makes idempotency optional)",
        )
    });
    let engine = args.engine.map(|(_, engine)| engine).ok_or_else(|| {
        let message = if args.transaction.is_some() {
            "missing `engine = …`: the `idem::Transactional` engine to record calls in, such as \
             `engine = self.idem` (an engine, a reference to one, or an `Arc` of one)"
        } else {
            "missing `engine = …`: the `idem::Idempotency` engine to record calls in, such as \
             `engine = self.idem` (an engine, a reference to one, or an `Arc` of one)"
        };
        syn::Error::new(Span::call_site(), message)
    });
    combine_errors(
        [
            form.as_ref().err().cloned(),
            scope.as_ref().err().cloned(),
            key.as_ref().err().cloned(),
            engine.as_ref().err().cloned(),
            transactional.err(),
            detach.as_ref().err().cloned(),
            steps.as_ref().err().cloned(),
            fingerprint.as_ref().err().cloned(),
        ]
        .into_iter()
        .flatten()
        .chain(borrowed),
    )?;
    let (form, return_type) = form?;
    let fingerprint = fingerprint?;
    Ok(Call {
        form,
        return_type,
        scope: scope?,
        key: key?,
        engine: engine?,
        caller: args.caller.map(|(_, caller)| caller),
        lease: args.lease.map(|(_, lease)| lease),
        retention: args.retention.map(|(_, retention)| retention),
        on_locked: args.on_locked.map(|(_, on_locked)| on_locked),
        on_lapse: args.on_lapse.map(|(_, on_lapse)| on_lapse),
        policy: match args.policy {
            Some((_, version)) => version,
            None => derived_policy(&fingerprint, sig),
        },
        fingerprint,
        transaction: args.transaction.map(|(_, parameter)| parameter),
        detach: detach?,
        steps: steps?,
        deprecated: args.deprecated,
    })
}

/// `R` of `Pin<Box<dyn Future<Output = R> + …>>`, the return type `#[async_trait]` gives the
/// methods it rewrites (paths may be qualified, as `::core::pin::Pin`).
fn boxed_future_output(ty: &Type) -> Option<&Type> {
    let Type::Path(pin) = ty else { return None };
    let pin = pin.path.segments.last().filter(|s| s.ident == "Pin")?;
    let boxed = single_type_argument(&pin.arguments)?;
    let Type::Path(boxed) = boxed else {
        return None;
    };
    let boxed = boxed.path.segments.last().filter(|s| s.ident == "Box")?;
    let Type::TraitObject(object) = single_type_argument(&boxed.arguments)? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let future = bound.path.segments.last().filter(|s| s.ident == "Future")?;
        let PathArguments::AngleBracketed(args) = &future.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(output) if output.ident == "Output" => Some(&output.ty),
            _ => None,
        })
    })
}

/// `T` of `<T>`.
fn single_type_argument(arguments: &PathArguments) -> Option<&Type> {
    let PathArguments::AngleBracketed(args) = arguments else {
        return None;
    };
    match (args.args.len(), args.args.first()) {
        (1, Some(GenericArgument::Type(ty))) => Some(ty),
        _ => None,
    }
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
    let on_lapse = args.on_lapse.as_ref().map(|(keyword, _)| {
        syn::Error::new_spanned(
            keyword,
            "`on_lapse` does not apply with `transaction`: the claim, the work and the result \
             commit together in your transaction, so a call that dies leaves nothing to lapse; \
             remove `on_lapse`",
        )
    });
    combine_errors([missing, lease, on_locked, on_lapse].into_iter().flatten())
}

/// The default policy version of a fingerprint: FNV-1a (32 bits) over what it is made of (the
/// hashed parameters' names and types, or the `fingerprint = …` expression, as written), so a
/// change to what the attribute hashes is a new version, and a retry across the deploy that
/// made it gets `PolicyChanged` rather than `KeyReused`. No fingerprint: 0.
fn derived_policy(fingerprint: &Fingerprint, sig: &syn::Signature) -> u32 {
    let text = match fingerprint {
        Fingerprint::Nothing => return 0,
        Fingerprint::Expr(expr) => format!("expr:{}", expr.to_token_stream()),
        Fingerprint::Arguments(names) => {
            let mut text = String::from("arguments:");
            for name in names {
                let ty = sig.inputs.iter().find_map(|input| match input {
                    syn::FnArg::Typed(typed) => match &*typed.pat {
                        syn::Pat::Ident(pat) if pat.ident == *name => {
                            Some(typed.ty.to_token_stream().to_string())
                        }
                        _ => None,
                    },
                    syn::FnArg::Receiver(_) => None,
                });
                text.push_str(&format!("{}:{};", name.unraw(), ty.unwrap_or_default()));
            }
            text
        }
    };
    let mut hash: u32 = 0x811c_9dc5;
    for byte in "idem-attr/v1\0".bytes().chain(text.bytes()) {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// One error holding every error of `errors`, or `Ok` when there is none.
pub(crate) fn combine_errors(errors: impl IntoIterator<Item = syn::Error>) -> syn::Result<()> {
    let mut errors = errors.into_iter();
    match errors.next() {
        None => Ok(()),
        Some(mut all) => {
            all.extend(errors);
            Err(all)
        }
    }
}

/// Without `scope = …`, the scope is the function's path, which holds its name: the name must
/// be ASCII, as every scope is.
fn check_default_scope(func: &ItemFn) -> syn::Result<()> {
    let ident = &func.sig.ident;
    let name = ident.unraw().to_string();
    check_scope(&name).map_err(|msg| {
        syn::Error::new(
            ident.span(),
            format!(
                "without `scope = …` the scope is the function's path, which ends in its name \
                 `{name}`, and {msg}: add `scope = \"…\"`"
            ),
        )
    })
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
        form,
        return_type,
        scope,
        key,
        engine,
        caller,
        fingerprint,
        lease,
        retention,
        on_locked,
        on_lapse,
        policy,
        transaction,
        detach,
        steps,
        deprecated,
    } = call;

    // User expressions keep their spans, so a type error points at what the user wrote; what
    // the return type must satisfy is checked, and reported, on the return type.
    let returns = return_type.span();
    let deprecated = deprecated.iter().map(deprecation);
    let scope = match scope {
        Some(lit) => quote!(#lit),
        // The path of an item declared here is the function's path plus the item's name.
        None => quote! {{
            fn __idem_scope() {}
            ::idem::__private::default_scope(__idem_scope)
        }},
    };
    let engine = match &transaction {
        None => quote_spanned! {engine.span()=>
            ::core::clone::Clone::clone(
                ::idem::__private::EngineArg::<::idem::Idempotency<_>>::engine(&(#engine))
            )
        },
        Some(_) => quote_spanned! {engine.span()=>
            ::core::clone::Clone::clone(
                ::idem::__private::EngineArg::<::idem::Transactional<_, _>>::engine(&(#engine))
            )
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
        Fingerprint::Expr(fp) => {
            quote_spanned! {fp.span()=> ::idem::__private::fingerprint(&(#fp))}
        }
        Fingerprint::Nothing => quote!(::core::result::Result::Ok(::core::option::Option::None)),
        // Each argument is checked on its own name, so one that is not `Serialize` is reported
        // there.
        Fingerprint::Arguments(names) => {
            let arguments = names.iter().map(|name| {
                let field = LitStr::new(&name.unraw().to_string(), name.span());
                quote_spanned! {name.span()=> ::idem::__private::argument(#field, &#name)}
            });
            quote!(::idem::__private::arguments(&[#(#arguments),*]))
        }
    };
    let lease = duration(lease);
    let retention = duration(retention);
    let on_locked = typed_on_locked(on_locked);
    let on_lapse = match on_lapse {
        Some(word) if word == "uncertain" => quote_spanned! {word.span()=>
            ::core::option::Option::Some(::idem::OnLapse::Uncertain)
        },
        Some(word) => quote_spanned! {word.span()=>
            ::core::option::Option::Some(::idem::OnLapse::Release)
        },
        None => quote!(::core::option::Option::None),
    };
    // Everything the record needs is computed from borrows before the body starts, so the body
    // may still move the function's arguments. With `transaction`, `lease` and `on_locked` are
    // refused, so the options hold the retention only.
    let prelude = quote! {
        #(#inner_attrs)*
        #(#deprecated)*
        let __idem_engine = #engine;
        let __idem_scope: &'static str = #scope;
        let __idem_prepared = ::idem::__private::Prepared {
            key: ::idem::__private::key(__idem_scope, #caller, #key),
            fingerprint: ::idem::__private::versioned(#fingerprint, #policy),
            options: ::idem::__private::options(#lease, #retention, #on_locked, #on_lapse)
                .scoped(__idem_scope),
        };
    };

    // The return type appears as the first type argument of `call` (or of `check_return`, where
    // `run_detached` runs the body): what it must satisfy is reported there, on the return type
    // the user wrote, and the rest of the call is spanned there too.
    let call = |work: TokenStream| match detach {
        false => quote_spanned! {returns=>
            ::idem::__private::call::<#return_type, _, _>(
                &__idem_engine,
                __idem_prepared,
                #work,
            )
            .await
        },
        // The body owns what it uses (`async move`) and must be `'static + Send`.
        true => quote_spanned! {returns=>
            ::idem::__private::check_return::<#return_type>();
            ::idem::__private::run_detached(
                &__idem_engine,
                __idem_prepared,
                ::idem::__private::body::<#return_type, _>(#work),
            )
            .await
        },
    };
    let body = match (transaction, form) {
        (None, Form::Async) if steps.is_some() => {
            let call = quote_spanned! {returns=>
                ::idem::__private::call_steps::<#return_type, _, _, _>(
                    &__idem_engine,
                    __idem_prepared,
                    move |#steps| async move #block,
                )
                .await
            };
            quote! {
                #prelude
                #call
            }
        }
        (None, Form::Async) => {
            let call = call(quote!(async move #block));
            quote! {
                #prelude
                #call
            }
        }
        // `#[async_trait]` made the body build a boxed future that owns the arguments: build
        // it after the key is derived, and return a boxed future that runs it through idem.
        (None, Form::Boxed) => {
            let call = call(quote!(__idem_body));
            quote! {
                #prelude
                let __idem_body = #block;
                ::std::boxed::Box::pin(async move { #call })
            }
        }
        (Some(tx), _) => {
            // `&mut *tx` reborrows the parameter, so `tx` stays usable, and coerces to the
            // store's connection type from a `&mut` connection or a `&mut Transaction`.
            let conn = quote_spanned! {tx.span()=>
                ::idem::__private::tx_connection(&__idem_engine, &mut *#tx)
            };
            quote! {
                #prelude
                ::idem::__private::check_return::<#return_type>();
                let __idem_claim = match ::idem::__private::tx_begin(
                    &__idem_engine,
                    #conn,
                    __idem_prepared,
                )
                .await
                {
                    ::core::result::Result::Ok(::idem::TxClaimOutcome::Run(__idem_claim)) => {
                        __idem_claim
                    }
                    ::core::result::Result::Ok(::idem::TxClaimOutcome::Replayed(__idem_value)) => {
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

/// A use of an old argument name: a deprecated item used at the keyword, so the compiler warns
/// there (a proc macro on stable Rust has no other way to emit a warning).
fn deprecation((keyword, new): &(Ident, &'static str)) -> TokenStream {
    let note = format!("`{keyword} = …` is now `{new} = …`: rename the argument");
    let item = Ident::new(&keyword.unraw().to_string(), keyword.span());
    quote_spanned! {keyword.span()=>
        {
            #[deprecated(note = #note)]
            fn #item() {}
            #item();
        }
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
