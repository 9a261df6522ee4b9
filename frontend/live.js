// A live shopper's «Войти» and «Выйти», on the checkout's own origin, loaded by the payment page
// only when its session is paid with live money. The e-mail and password go to this origin's
// API only; a new account is made when the code mailed to its address is entered; the sign-in (a token that expires) is kept in this tab's sessionStorage, where the
// widget finds it when the page starts again; «Выйти» revokes it on the server and forgets it.
(function start() {
  "use strict";
  // The widget renders after this script runs: wait for its card.
  if (!document.querySelector(".account")) {
    new MutationObserver((_, observer) => {
      if (document.querySelector(".account")) {
        observer.disconnect();
        start();
      }
    }).observe(document.body, { childList: true, subtree: true });
    return;
  }
  const SAVED = "checkout.live";
  const account = document.querySelector(".account");
  if (account && sessionStorage.getItem(SAVED)) {
    const signOut = document.createElement("button");
    signOut.type = "button";
    signOut.className = "sign-out";
    signOut.textContent = "Выйти";
    account.append(signOut);
    signOut.addEventListener("click", async () => {
      signOut.disabled = true;
      let saved = null;
      try { saved = JSON.parse(sessionStorage.getItem(SAVED)); } catch (_) {}
      if (saved && saved.token) {
        await fetch("/api/shoppers/sign-out", {
          method: "POST",
          headers: { Authorization: `Bearer ${saved.token}` },
        }).catch(() => {});
      }
      sessionStorage.removeItem(SAVED);
      location.reload();
    });
  }
  const form = document.getElementById("sign-in");
  const slot = document.querySelector(".sign-in-slot");
  if (!form || !slot || sessionStorage.getItem(SAVED)) return;
  slot.append(form);
  form.hidden = false;
  const error = document.getElementById("sign-in-error");
  // What a refusal means to the shopper, by its stable code (never the server's English).
  const REFUSALS = {
    invalid_credentials: "Неверная почта или пароль.",
    email_unconfirmed: "Почта не подтверждена: нажмите «Создать счёт», и мы пришлём код.",
    invalid_code: "Код неверный или устарел. Нажмите «Создать счёт» ещё раз за новым кодом.",
    mail_unavailable: "Не удалось отправить письмо: попробуйте ещё раз.",
    too_many_requests: "Слишком много попыток: подождите минуту.",
    invalid_request: "Проверьте почту; пароль — не меньше 8 знаков.",
  };
  const confirm = document.getElementById("confirm");
  let busy = false;
  // Posts `body` to `path`; a token signs the tab in (the page starts again), a `202` (the code
  // went out) shows the code's form; anything else is said in `shown`.
  async function post(path, body, shown) {
    if (busy) return;
    busy = true;
    shown.textContent = "";
    try {
      const answer = await fetch(path, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      const json = await answer.json().catch(() => ({}));
      if (answer.ok && json.token) {
        sessionStorage.setItem(SAVED, JSON.stringify({ token: json.token, account_id: json.account_id }));
        location.reload();
        return;
      }
      if (answer.status === 202) {
        document.getElementById("confirm-sent").textContent =
          `Мы отправили письмо на ${body.email}. Введите код из него: он действует 10 минут.`;
        form.hidden = true;
        slot.append(confirm);
        confirm.hidden = false;
        confirm.elements.code.focus();
      } else {
        shown.textContent = REFUSALS[json.code] || "Сервер отказал: попробуйте ещё раз.";
      }
    } catch (_) {
      shown.textContent = "Нет связи с сервером: попробуйте ещё раз.";
    }
    busy = false;
  }
  const credentials = () => ({
    email: form.elements.email.value,
    password: form.elements.password.value,
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    post("/api/shoppers/sign-in", credentials(), error);
  });
  document.getElementById("sign-up").addEventListener("click", () => {
    if (form.reportValidity()) post("/api/shoppers", credentials(), error);
  });
  confirm.addEventListener("submit", (event) => {
    event.preventDefault();
    const code = { email: form.elements.email.value, code: confirm.elements.code.value.trim() };
    post("/api/shoppers/confirm", code, document.getElementById("confirm-error"));
  });
  form.elements.email.focus();
})();
