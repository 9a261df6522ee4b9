//! Every word the shopper reads about a refusal or a failure, in Russian, chosen by what
//! happened (the problem's stable `code`), never taken from the server's English `detail`.

use checkout_shared::ErrorCode;

pub const UNREADABLE_ANSWER: &str = "сервер прислал непонятный ответ";
pub const STILL_IN_PROGRESS: &str = "сервер всё ещё проводит операцию";
pub const NO_CONNECTION: &str = "нет связи с сервером";
pub const SESSION_LOST: &str = "сессия истекла; обновите страницу";
pub const SESSION_RENEWED: &str = "Прежняя демо-сессия больше не действует, поэтому открыта новая демо-сессия: платежи идут с её счёта.";
pub const STATE_UNREADABLE: &str = "Не удалось прочитать сохранённое состояние оплаты. Мы проверили на сервере, что стало с начатым платежом: дважды деньги не спишутся.";
pub const STATE_UNREADABLE_NOTHING_FOUND: &str = "Не удалось прочитать сохранённое состояние оплаты, и в нём не нашлось начатого платежа. Если вы уже платили, проверьте баланс счёта, прежде чем платить снова.";
pub const STATE_NOT_SAVED: &str =
    "Браузер не дал сохранить состояние оплаты: не обновляйте страницу, пока платёж не завершится.";
pub const OTHER_TAB: &str = "выполняется в другой вкладке, ждём…";

/// What a refusal with this `code` means to the shopper.
pub fn refusal(code: ErrorCode) -> String {
    match code {
        ErrorCode::InvalidRequest => "сервер счёл запрос неверным",
        ErrorCode::Unauthorized => "сессия истекла",
        ErrorCode::NotFound => "платёж не найден",
        ErrorCode::MethodNotAllowed => "сервер не принимает такой запрос",
        ErrorCode::PayloadTooLarge => "запрос слишком велик",
        ErrorCode::IdempotencyKeyReused => "ключ этой операции уже использован для другой",
        ErrorCode::IdempotencyKeyInUse => STILL_IN_PROGRESS,
        ErrorCode::InsufficientFunds => "недостаточно средств",
        ErrorCode::OrderAlreadyPaid | ErrorCode::SessionAlreadyPaid => "этот заказ уже оплачен",
        ErrorCode::SessionExpired => {
            "время на оплату заказа истекло: вернитесь в магазин и оформите его снова"
        }
        ErrorCode::Forbidden => "это действие доступно только магазину",
        ErrorCode::OrderSessionExists => "у этого заказа уже есть оплата",
        ErrorCode::RefundExceedsPayment => "сумма больше того, что осталось вернуть",
        ErrorCode::RequestTimeout => "сервер не успел ответить",
        ErrorCode::ServiceUnavailable => "сервис временно недоступен",
        ErrorCode::InternalError => "ошибка на сервере",
        // The widget pays with a shopper of the session's own mode, and one request at a time:
        // these two are not expected here. Sign-in, sign-up and their codes are answered in the
        // account window ([`account_refusal`]).
        ErrorCode::LivemodeMismatch
        | ErrorCode::TooManyRequests
        | ErrorCode::InvalidCredentials
        | ErrorCode::InvalidCode
        | ErrorCode::EmailUnconfirmed
        | ErrorCode::MailUnavailable
        | ErrorCode::PasskeyRejected
        | ErrorCode::Unknown => "сервер отказал",
    }
    .to_owned()
}

/// The account window's refusals (sign-in, sign-up, codes, passkeys), as whole sentences.
pub fn account_refusal(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InvalidCredentials => "Неверная почта или пароль.",
        ErrorCode::EmailUnconfirmed => {
            "Почта не подтверждена: нажмите «Создать счёт», и мы пришлём код."
        }
        ErrorCode::InvalidCode => "Код неверный или устарел. Запросите новый.",
        ErrorCode::MailUnavailable => "Не удалось отправить письмо: попробуйте ещё раз.",
        ErrorCode::TooManyRequests => "Слишком много попыток: подождите минуту.",
        ErrorCode::InvalidRequest => "Проверьте почту; пароль — не меньше 8 знаков.",
        ErrorCode::Unauthorized => "Вход истёк: войдите снова.",
        ErrorCode::PasskeyRejected => {
            "Ключ доступа не подошёл: он не от этого счёта или устарел. Войдите по паролю или восстановите доступ."
        }
        ErrorCode::ServiceUnavailable | ErrorCode::InternalError | ErrorCode::RequestTimeout => {
            "Сервер не смог ответить: попробуйте ещё раз."
        }
        _ => "Сервер отказал: попробуйте ещё раз.",
    }
}

pub const ACCOUNT_UNREADABLE: &str = "Сервер прислал непонятный ответ: попробуйте ещё раз.";
pub const ACCOUNT_NO_CONNECTION: &str = "Нет связи с сервером: попробуйте ещё раз.";
pub const PASSKEY_CANCELLED: &str =
    "Ключ доступа не использован: окно устройства закрыто или время вышло. Попробуйте ещё раз.";

/// A refusal without a problem body: only its status is known.
pub fn status_refusal(status: u16) -> String {
    format!("сервер ответил ошибкой {status}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_refusal_is_in_english() {
        let codes = [
            ErrorCode::InvalidRequest,
            ErrorCode::Unauthorized,
            ErrorCode::NotFound,
            ErrorCode::MethodNotAllowed,
            ErrorCode::PayloadTooLarge,
            ErrorCode::IdempotencyKeyReused,
            ErrorCode::IdempotencyKeyInUse,
            ErrorCode::InsufficientFunds,
            ErrorCode::OrderAlreadyPaid,
            ErrorCode::SessionAlreadyPaid,
            ErrorCode::SessionExpired,
            ErrorCode::Forbidden,
            ErrorCode::OrderSessionExists,
            ErrorCode::RefundExceedsPayment,
            ErrorCode::RequestTimeout,
            ErrorCode::ServiceUnavailable,
            ErrorCode::InternalError,
            ErrorCode::LivemodeMismatch,
            ErrorCode::TooManyRequests,
            ErrorCode::InvalidCredentials,
            ErrorCode::InvalidCode,
            ErrorCode::EmailUnconfirmed,
            ErrorCode::MailUnavailable,
            ErrorCode::PasskeyRejected,
            ErrorCode::Unknown,
        ];
        for text in codes.map(refusal) {
            assert!(!text.chars().any(|c| c.is_ascii_alphabetic()), "{text}");
        }
        for text in codes.map(account_refusal) {
            assert!(!text.chars().any(|c| c.is_ascii_alphabetic()), "{text}");
            assert!(text.ends_with('.'), "a whole sentence: {text}");
        }
    }
}
