// A `&self` method: the struct's fields feed `key`, `caller` and `store`, the body uses `self`
// and moves its arguments.
use idem::{idempotent, Idempotency, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
enum BankError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

// `Serialize`: the request is the default fingerprint (`key` takes one of its fields).
#[derive(Serialize)]
struct Deposit {
    request_id: String,
    amount: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    request_id: String,
    balance: u64,
}

struct Bank {
    idem: Idempotency,
    tenant: String,
    balance: std::sync::Mutex<u64>,
}

impl Bank {
    /// Deposits once per request id.
    #[idempotent(key = req.request_id, caller = self.tenant, scope = "deposit", engine = self.idem)]
    pub async fn deposit(&self, req: Deposit) -> Result<Receipt, BankError> {
        let mut balance = self.balance.lock().unwrap();
        *balance += req.amount;
        Ok(Receipt {
            request_id: req.request_id,
            balance: *balance,
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let bank = Bank {
        idem: Idempotency::new(MemoryStore::new()),
        tenant: "acme".into(),
        balance: std::sync::Mutex::new(0),
    };
    let deposit = || Deposit {
        request_id: "r-1".into(),
        amount: 70,
    };
    let first = bank.deposit(deposit()).await.unwrap();
    let again = bank.deposit(deposit()).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(first.balance, 70);
    assert_eq!(*bank.balance.lock().unwrap(), 70);
}
