// A live shopper's «Войти» and «Выйти», on the checkout's own origin, loaded by the payment page
// only when its session is paid with live money. The e-mail and password go to this origin's
// API only; the sign-in (a token that expires) is kept in this tab's sessionStorage, where the
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
    email_taken: "На эту почту уже есть счёт: войдите.",
    too_many_requests: "Слишком много попыток: подождите минуту.",
    invalid_request: "Проверьте почту; пароль — не меньше 8 знаков.",
  };
  let busy = false;
  async function go(newAccount) {
    if (busy) return;
    if (!form.reportValidity()) return;
    busy = true;
    error.textContent = "";
    const body = JSON.stringify({
      email: form.elements.email.value,
      password: form.elements.password.value,
    });
    try {
      const answer = await fetch(newAccount ? "/api/shoppers" : "/api/shoppers/sign-in", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body,
      });
      const json = await answer.json().catch(() => ({}));
      if (answer.ok && json.token) {
        sessionStorage.setItem(SAVED, JSON.stringify({ token: json.token, account_id: json.account_id }));
        location.reload();
        return;
      }
      error.textContent = REFUSALS[json.code] || "Сервер отказал: попробуйте ещё раз.";
    } catch (_) {
      error.textContent = "Нет связи с сервером: попробуйте ещё раз.";
    }
    busy = false;
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    go(false);
  });
  document.getElementById("sign-up").addEventListener("click", () => go(true));
  form.elements.email.focus();
})();
